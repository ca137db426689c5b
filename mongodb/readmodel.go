package mongodb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/errgroup"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// EventLog is the log a projection fills gaps from (projection.Log).
type EventLog = projection.Log

// jsonTags stores read-model documents with the domain types' JSON field
// names, so the domain needs no BSON tags.
var jsonTags = options.Collection().SetBSONOptions(&options.BSONOptions{UseJSONStructTags: true})

// ReadModel writes one collection of a projection's read model, keeping
// invariant 4. Each document carries version, the stream version it
// reflects, and every write is a compare-and-set on it: a replacement with
// upsert whose filter is {_id, version: {$lt: v}}. A write of an older or
// equal version matches nothing, and its upsert meets the existing _id: a
// duplicate key, which means a newer version is already stored, so the
// write is done. No write, however late it lands (a deposed partition
// owner's, one the driver retried across an election), can move a
// document back, and writers racing in any number of processes cannot lose
// an update: each writes a fold of the log at its version. A batch is one
// unordered bulk write of such replacements; the embedded store's funnel
// serves the guard at index speed.
//
// An event at or below the version is skipped; a gap is filled from the
// log. Documents this process wrote are cached, so a batch usually reads
// nothing before writing.
type ReadModel[D any] struct {
	def     projection.Definition[D]
	coll    *mongo.Collection
	events  EventLog
	metrics *projection.Metrics
	cache   *lru.Cache[string, D]
}

func (s *ReadModel[D]) purge() { s.cache.Purge() }

// cacheSize is how many documents a ReadModel remembers.
const cacheSize = 100_000

// NewReadModel returns the read model of def in its collection in db,
// folding gaps from events. m may be nil; the projection's counters in it
// are created at once, at 0.
func NewReadModel[D any](db *mongo.Database, def projection.Definition[D], events EventLog, m *projection.Metrics) *ReadModel[D] {
	c, _ := lru.New[string, D](cacheSize)
	m.Init(def.Name)
	return &ReadModel[D]{def: def, coll: db.Collection(def.Collection, jsonTags), events: events, metrics: m, cache: c}
}

// EnsureIndexes creates the definition's indexes, one per call: FerretDB
// 1.24 drops the connection when one call names several indexes that
// already exist.
func (s *ReadModel[D]) EnsureIndexes(ctx context.Context) error {
	for _, fields := range s.def.Indexes {
		keys := bson.D{}
		for _, f := range fields {
			keys = append(keys, bson.E{Key: f, Value: 1})
		}
		if _, err := s.coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys}); err != nil {
			return fmt.Errorf("create index on %s: %w", s.def.Collection, Translate(err))
		}
	}
	return nil
}

// stored is a read-model document with its stream id as _id.
type stored[D any] struct {
	ID  string `bson:"_id"`
	Doc D      `bson:",inline"`
}

// parallel is how many streams of a batch fill their gaps from the log at
// once.
const parallel = 4

// Apply folds events (any streams, any order, duplicates allowed) into the
// read model. It returns per-stream errors for streams whose events cannot
// be applied (poison: the caller parks them) and an error for failures
// that may pass (store unavailable): then nothing is known to be written
// and the caller redelivers. When both are nil every stream's document
// reflects at least the highest version given for it.
func (s *ReadModel[D]) Apply(ctx context.Context, events []domain.Event) (projection.Outcome, map[string]error, error) {
	return s.apply(ctx, events, false)
}

// folded is one stream's next document, to be written.
type folded[D any] struct {
	id     string
	doc    D
	events int                     // events folded into doc
	poison *projection.PoisonError // events after those could not be applied
}

// apply is Apply; fresh makes it read every document instead of trusting
// the cache (redeliveries). It reads the documents the cache lacks, folds
// each stream (filling gaps from the log) and writes the batch in one
// bulk write.
func (s *ReadModel[D]) apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error) {
	byStream := map[string][]domain.Event{}
	for _, e := range events {
		byStream[e.StreamID] = append(byStream[e.StreamID], e)
	}
	ids := slices.Sorted(maps.Keys(byStream))
	cur, err := s.current(ctx, ids, fresh)
	if err != nil {
		return projection.Outcome{}, nil, err
	}
	var (
		mu     sync.Mutex
		out    projection.Outcome
		writes []folded[D]
		poison = map[string]error{}
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for _, id := range ids {
		g.Go(func() error {
			f, o, err := s.fold(gctx, id, cur[id], byStream[id])
			mu.Lock()
			defer mu.Unlock()
			out.Add(o)
			if f.events > 0 {
				writes = append(writes, f)
			} else if f.poison != nil {
				poison[id] = f.poison
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		s.metrics.Record(s.def.Name, out)
		return out, nil, err
	}
	superseded, err := s.write(ctx, writes)
	if err != nil {
		return out, nil, err
	}
	for _, f := range writes {
		out.Applied += f.events
		if f.poison != nil {
			poison[f.id] = f.poison
		}
	}
	out.Superseded = superseded
	s.metrics.Record(s.def.Name, out)
	return out, poison, nil
}

// current returns the documents of ids from the cache, reading the others
// (all of them when fresh); a stream without a document has none in the
// map.
func (s *ReadModel[D]) current(ctx context.Context, ids []string, fresh bool) (map[string]D, error) {
	out := make(map[string]D, len(ids))
	var missing []string
	for _, id := range ids {
		if d, ok := s.cache.Get(id); ok && !fresh {
			out[id] = d
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	dialect, err := DialectOf(ctx, s.coll.Database().Client())
	if err != nil {
		return nil, err
	}
	if dialect == DialectFerretDB {
		// FerretDB scans the whole collection for {_id: {$in: ...}}; one
		// {_id: v} look-up per document reads the index instead.
		var mu sync.Mutex
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(parallel)
		for _, id := range missing {
			g.Go(func() error {
				d, found, err := s.read(gctx, id)
				if found {
					mu.Lock()
					out[id] = d
					mu.Unlock()
				}
				return err
			})
		}
		return out, g.Wait()
	}
	cursor, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: missing}}}})
	if err != nil {
		return nil, fmt.Errorf("%s: read %d documents: %w", s.def.Name, len(missing), Translate(err))
	}
	var docs []stored[D]
	if err := cursor.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("%s: read %d documents: %w", s.def.Name, len(missing), Translate(err))
	}
	for _, d := range docs {
		out[d.ID] = d.Doc
		s.cache.Add(d.ID, d.Doc)
	}
	return out, nil
}

// fold brings doc, the stored document of stream id (zero if none), up
// to the highest version in evs (projection.Definition.Advance).
func (s *ReadModel[D]) fold(ctx context.Context, id string, doc D, evs []domain.Event) (folded[D], projection.Outcome, error) {
	st, out, err := s.def.Advance(ctx, s.events, id, doc, evs)
	return folded[D]{id: id, doc: st.Doc, events: st.Events, poison: st.Poison}, out, err
}

// read returns a stream's document; found is false when there is none.
func (s *ReadModel[D]) read(ctx context.Context, id string) (doc D, found bool, err error) {
	var d stored[D]
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return doc, false, nil
	}
	if err != nil {
		return doc, false, fmt.Errorf("%s: read %s: %w", s.def.Name, id, Translate(err))
	}
	s.cache.Add(id, d.Doc)
	return d.Doc, true, nil
}

// guarded is the filter of a write of version v of document id: it
// matches the document only while it is older.
func guarded(id string, v int64) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}}
}

// write stores the folded documents in one unordered bulk write of
// version-guarded replacements. It returns how many the guard refused
// (a newer version was stored: the write is done), or an error that may
// pass, after which any of the documents may or may not be written.
func (s *ReadModel[D]) write(ctx context.Context, docs []folded[D]) (superseded int, err error) {
	if len(docs) == 0 {
		return 0, nil
	}
	models := make([]mongo.WriteModel, len(docs))
	for i, f := range docs {
		body, err := storedBSON(f.id, f.doc)
		if err != nil {
			return 0, fmt.Errorf("%s: encode %s: %w", s.def.Name, f.id, err)
		}
		models[i] = mongo.NewReplaceOneModel().SetFilter(guarded(f.id, s.def.StreamVersion(&f.doc))).SetReplacement(body).SetUpsert(true)
	}
	_, err = s.coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	refused, err := splitSuperseded(err)
	if err != nil {
		for _, f := range docs {
			s.cache.Remove(f.id)
		}
		return 0, fmt.Errorf("%s: write %d documents: %w", s.def.Name, len(docs), Translate(err))
	}
	for i, f := range docs {
		if refused[i] {
			// The stored document is newer than f.doc: read it when next needed.
			s.cache.Remove(f.id)
		} else {
			s.cache.Add(f.id, f.doc)
		}
	}
	return len(refused), nil
}

// splitSuperseded splits the error of an unordered bulk write of guarded
// writes: the indexes whose write met a newer document (a duplicate key
// on _id), and what else went wrong (nil if nothing).
func splitSuperseded(err error) (map[int]bool, error) {
	var bwe mongo.BulkWriteException
	if err == nil || !errors.As(err, &bwe) || bwe.WriteConcernError != nil {
		return nil, err
	}
	refused := map[int]bool{}
	for _, we := range bwe.WriteErrors {
		if !mongo.IsDuplicateKeyError(we) {
			return nil, err
		}
		refused[we.Index] = true
	}
	return refused, nil
}

// marshalJSONTags encodes v with its JSON field names.
func marshalJSONTags(v any) (bson.Raw, error) {
	buf := new(bytes.Buffer)
	enc := bson.NewEncoder(bson.NewDocumentWriter(buf))
	enc.UseJSONStructTags()
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bson.Raw(buf.Bytes()), nil
}

// Get returns the document of one stream, or an error wrapping
// domain.ErrNotFound.
func (s *ReadModel[D]) Get(ctx context.Context, id string) (D, error) {
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return d.Doc, fmt.Errorf("%s %s: %w", s.def.Name, id, domain.ErrNotFound)
	}
	if err != nil {
		return d.Doc, fmt.Errorf("%s %s: %w", s.def.Name, id, Translate(err))
	}
	return d.Doc, nil
}
