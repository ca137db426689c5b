package projections

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
)

// EventLog is the part of the event store a projection needs: the events of
// a stream from a version on, to fill gaps.
type EventLog interface {
	LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error)
}

// jsonTags stores read-model documents with the domain types' JSON field
// names, so the domain needs no BSON tags.
var jsonTags = options.Collection().SetBSONOptions(&options.BSONOptions{UseJSONStructTags: true})

// Store writes one projection's read model. Apply keeps invariant 4: an
// event at or below a document's version is skipped, a gap is filled from
// the log, and every write is a compare-and-set on the version it read.
type Store[D any] struct {
	def     Definition[D]
	coll    *mongo.Collection
	log     EventLog
	metrics *Metrics
}

// NewStore returns the store of def's read model in db, folding gaps from
// log. m may be nil.
func NewStore[D any](db *mongo.Database, def Definition[D], log EventLog, m *Metrics) *Store[D] {
	return &Store[D]{def: def, coll: db.Collection(def.Collection, jsonTags), log: log, metrics: m}
}

// EnsureIndexes creates the definition's indexes.
func (s *Store[D]) EnsureIndexes(ctx context.Context) error {
	if len(s.def.Indexes) == 0 {
		return nil
	}
	models := make([]mongo.IndexModel, 0, len(s.def.Indexes))
	for _, fields := range s.def.Indexes {
		keys := bson.D{}
		for _, f := range fields {
			keys = append(keys, bson.E{Key: f, Value: 1})
		}
		models = append(models, mongo.IndexModel{Keys: keys})
	}
	// One index per call: FerretDB 1.24 drops the connection when one call
	// names several indexes that already exist.
	for _, m := range models {
		if _, err := s.coll.Indexes().CreateOne(ctx, m); err != nil {
			return fmt.Errorf("create index on %s: %w", s.def.Collection, translate(err))
		}
	}
	return nil
}

// stored is a read-model document with its stream id as _id.
type stored[D any] struct {
	ID  string `bson:"_id"`
	Doc D      `bson:",inline"`
}

// Outcome counts what one Apply did.
type Outcome struct {
	Applied    int // events folded into documents
	Duplicates int // events at or below the stored version, skipped
	GapsFilled int // streams whose gap was read from the log
}

// maxCASRounds bounds the compare-and-set retries of one Apply; each lost
// round means another writer advanced the documents, so progress is made.
const maxCASRounds = 8

// Apply folds events (any streams, any order, duplicates allowed) into the
// read model. It returns per-stream errors for streams whose events cannot
// be applied (poison: the caller parks them) and an error for failures
// that may pass (store unavailable): then nothing is known to be written
// and the caller redelivers. When both are nil every stream's document
// reflects at least the highest version given for it.
func (s *Store[D]) Apply(ctx context.Context, events []domain.Event) (Outcome, map[string]error, error) {
	byStream := map[string][]domain.Event{}
	for _, e := range events {
		byStream[e.StreamID] = append(byStream[e.StreamID], e)
	}
	want := map[string]int64{}
	for id, evs := range byStream {
		slices.SortFunc(evs, func(a, b domain.Event) int { return cmp.Compare(a.Version, b.Version) })
		byStream[id] = slices.CompactFunc(evs, func(a, b domain.Event) bool { return a.Version == b.Version })
		want[id] = evs[len(evs)-1].Version
	}
	var out Outcome
	poison := map[string]error{}
	pending := byStream
	for round := 0; len(pending) > 0; round++ {
		if round == maxCASRounds {
			return out, poison, fmt.Errorf("%s: %d streams still contended after %d rounds", s.def.Name, len(pending), round)
		}
		docs, err := s.load(ctx, keys(pending))
		if err != nil {
			return out, poison, err
		}
		var writes []mongo.WriteModel
		var written []string
		for id, evs := range pending {
			doc, found := docs[id]
			from := int64(0)
			if found {
				from = s.def.Version(&doc)
			}
			if from >= want[id] {
				if round == 0 {
					out.Duplicates += len(evs)
				}
				continue
			}
			next := slices.DeleteFunc(slices.Clone(evs), func(e domain.Event) bool { return e.Version <= from })
			if round == 0 {
				out.Duplicates += len(evs) - len(next)
			}
			if !contiguous(next, from+1) {
				// A gap: the log has the missing events (and maybe more).
				next, err = s.log.LoadFrom(ctx, id, from+1)
				if err != nil {
					return out, poison, fmt.Errorf("fill gap of %s after v%d: %w", id, from, err)
				}
				out.GapsFilled++
				if !contiguous(next, from+1) || len(next) == 0 || next[len(next)-1].Version < want[id] {
					poison[id] = fmt.Errorf("fill gap of %s after v%d: the log does not hold v%d", id, from, want[id])
					continue
				}
			}
			var apply error
			for _, e := range next {
				if apply = s.def.Apply(&doc, e); apply != nil {
					apply = fmt.Errorf("%s: apply %s v%d of %s: %w", s.def.Name, e.Type, e.Version, id, apply)
					break
				}
			}
			if apply != nil {
				poison[id] = apply
				continue
			}
			out.Applied += len(next)
			writes = append(writes, mongo.NewReplaceOneModel().
				SetFilter(bson.D{{Key: "_id", Value: id}, {Key: "version", Value: from}}).
				SetReplacement(stored[D]{ID: id, Doc: doc}).SetUpsert(true))
			written = append(written, id)
		}
		if len(writes) == 0 {
			return out, poison, nil
		}
		// Ordered, because FerretDB stops an unordered bulk at its first
		// error too; and it reports that error at the wrong index with no
		// counts, so a failed bulk is followed by a re-read (next round),
		// never by trusting the result.
		_, err = s.coll.BulkWrite(ctx, writes, options.BulkWrite().SetOrdered(true))
		if err == nil {
			return out, poison, nil
		}
		if !isDuplicate(err) {
			return out, poison, fmt.Errorf("%s: write %d documents: %w", s.def.Name, len(writes), translate(err))
		}
		// Some compare-and-set lost: another writer moved those documents.
		// Re-read every written stream and redo the ones still behind.
		s.metrics.casRetry(s.def.Name)
		next := map[string][]domain.Event{}
		for _, id := range written {
			next[id] = pending[id]
		}
		pending = next
	}
	return out, poison, nil
}

func contiguous(evs []domain.Event, from int64) bool {
	for i, e := range evs {
		if e.Version != from+int64(i) {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// load reads the documents of ids in one round trip.
func (s *Store[D]) load(ctx context.Context, ids []string) (map[string]D, error) {
	cur, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return nil, fmt.Errorf("%s: read %d documents: %w", s.def.Name, len(ids), translate(err))
	}
	var docs []stored[D]
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("%s: read %d documents: %w", s.def.Name, len(ids), translate(err))
	}
	out := make(map[string]D, len(docs))
	for _, d := range docs {
		out[d.ID] = d.Doc
	}
	return out, nil
}

// Get returns the document of one stream, or an error wrapping
// domain.ErrNotFound.
func (s *Store[D]) Get(ctx context.Context, id string) (D, error) {
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d.Doc, fmt.Errorf("%s %s: %w", s.def.Name, id, domain.ErrNotFound)
	}
	if err != nil {
		return d.Doc, fmt.Errorf("%s %s: %w", s.def.Name, id, translate(err))
	}
	return d.Doc, nil
}

func isDuplicate(err error) bool { return err != nil && mongo.IsDuplicateKeyError(err) }

// translate maps driver errors that are not a server's answer to
// domain.ErrUnavailable, as eventstore does.
func translate(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se mongo.ServerError
	if errors.As(err, &se) && !mongo.IsNetworkError(err) {
		return err
	}
	return fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
}
