package projection

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/errgroup"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	mongoerr "github.com/orderd/orderd/mongodb"
)

// EventLog is the part of the event store a projection needs: the events of
// a stream from a version on, to fill gaps. LoadFrom's errors wrap
// domain.ErrUnreadableCommit for a commit the log holds but this build
// cannot read, domain.ErrUnavailable when the store cannot be reached.
type EventLog interface {
	LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error)
}

// jsonTags stores read-model documents with the domain types' JSON field
// names, so the domain needs no BSON tags.
var jsonTags = options.Collection().SetBSONOptions(&options.BSONOptions{UseJSONStructTags: true})

// ReadModel writes one collection of a projection's read model, keeping
// invariant 4 with single-document operations by _id only (on big
// collections the one filter the embedded store answers from an index;
// any other it evaluates in Go over the whole collection):
//
// Each document carries version (the stream version it reflects) and
// attempted, the highest version any writer has tried to write, kept with
// $max. A write is one findOneAndUpdate by _id that sets the folded fields
// and $max-es attempted, returning the document as written. If attempted
// came back above the version written, a writer with a newer state got
// there first and this write may have overwritten it: the writer folds the
// stream again, from the log, up to at least attempted, and writes again.
// The last write to a document therefore always sees the highest attempted
// version and leaves the document at it, so no update is lost between
// writers in any number of processes (single-document updates are atomic);
// a reader may for a moment see an older version between the two writes
// of such a race. It stays the write: a compare-and-set on {_id, version}
// would be a filter beyond _id, a scan of the read model on the embedded
// store, for the same one round trip.
//
// An event at or below the version is skipped; a gap is filled from the
// log. Documents this process wrote are cached, so a batch usually reads
// nothing before writing.
type ReadModel[D any] struct {
	def     Definition[D]
	coll    *mongo.Collection
	events  EventLog
	metrics *Metrics
	cache   *lru.Cache[string, entry[D]]
	fields  []string // top-level field names of D, for $unset
}

type entry[D any] struct {
	doc       D
	attempted int64
}

func (s *ReadModel[D]) purge() { s.cache.Purge() }

// cacheSize is how many documents a ReadModel remembers.
const cacheSize = 100_000

// NewReadModel returns the read model of def in its collection in db,
// folding gaps from events. m may be nil; the projection's counters in it
// are created at once, at 0.
func NewReadModel[D any](db *mongo.Database, def Definition[D], events EventLog, m *Metrics) *ReadModel[D] {
	c, _ := lru.New[string, entry[D]](cacheSize)
	m.initProjection(def.Name)
	return &ReadModel[D]{def: def, coll: db.Collection(def.Collection, jsonTags), events: events, metrics: m, cache: c, fields: jsonFields[D]()}
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
			return fmt.Errorf("create index on %s: %w", s.def.Collection, mongoerr.Translate(err))
		}
	}
	return nil
}

// stored is a read-model document with its stream id as _id.
type stored[D any] struct {
	ID        string `bson:"_id"`
	Attempted int64  `bson:"attempted"`
	Doc       D      `bson:",inline"`
}

// Outcome counts what one Apply did.
type Outcome struct {
	Applied    int // events folded into documents
	Duplicates int // events at or below the stored version, skipped
	GapsFilled int // streams whose gap was read from the log
	Repairs    int // writes redone because a newer version was attempted
}

func (o *Outcome) add(p Outcome) {
	o.Applied += p.Applied
	o.Duplicates += p.Duplicates
	o.GapsFilled += p.GapsFilled
	o.Repairs += p.Repairs
}

// maxRounds bounds the writes of one stream in one Apply; each repair
// round means another writer advanced the document, so progress is made.
const maxRounds = 8

// parallel is how many streams of a batch are written at once.
const parallel = 4

// Apply folds events (any streams, any order, duplicates allowed) into the
// read model. It returns per-stream errors for streams whose events cannot
// be applied (poison: the caller parks them) and an error for failures
// that may pass (store unavailable): then nothing is known to be written
// and the caller redelivers. When both are nil every stream's document
// reflects at least the highest version given for it.
func (s *ReadModel[D]) Apply(ctx context.Context, events []domain.Event) (Outcome, map[string]error, error) {
	return s.apply(ctx, events, false)
}

// apply is Apply; fresh makes it read every document instead of trusting
// the cache (redeliveries).
func (s *ReadModel[D]) apply(ctx context.Context, events []domain.Event, fresh bool) (Outcome, map[string]error, error) {
	byStream := map[string][]domain.Event{}
	for _, e := range events {
		byStream[e.StreamID] = append(byStream[e.StreamID], e)
	}
	var (
		mu     sync.Mutex
		out    Outcome
		poison = map[string]error{}
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for id, evs := range byStream {
		g.Go(func() error {
			o, perr, err := s.applyStream(gctx, id, evs, fresh)
			mu.Lock()
			defer mu.Unlock()
			out.add(o)
			if perr != nil {
				poison[id] = perr
			}
			return err
		})
	}
	err := g.Wait()
	s.metrics.outcome(s.def.Name, out)
	return out, poison, err
}

// applyStream brings one document up to the highest version in evs (and
// to any higher version attempted). It returns a poison error for events
// that cannot be applied, or an error that may pass.
func (s *ReadModel[D]) applyStream(ctx context.Context, id string, evs []domain.Event, fresh bool) (out Outcome, poison, err error) {
	slices.SortFunc(evs, func(a, b domain.Event) int { return cmp.Compare(a.Version, b.Version) })
	evs = slices.CompactFunc(evs, func(a, b domain.Event) bool { return a.Version == b.Version })
	want := evs[len(evs)-1].Version
	cur, ok := s.cache.Get(id)
	if !ok || fresh {
		if cur, err = s.read(ctx, id); err != nil {
			return out, nil, err
		}
	}
	for round := 0; ; round++ {
		from := s.def.Version(&cur.doc)
		target := max(want, cur.attempted)
		if from >= target {
			if round == 0 {
				out.Duplicates += len(evs)
			}
			return out, nil, nil
		}
		if round == maxRounds {
			return out, nil, fmt.Errorf("%s %s: still contended after %d writes", s.def.Name, id, round)
		}
		next := slices.DeleteFunc(slices.Clone(evs), func(e domain.Event) bool { return e.Version <= from })
		if round == 0 {
			out.Duplicates += len(evs) - len(next)
		}
		if !contiguous(next, from+1) || len(next) == 0 || next[len(next)-1].Version < target {
			// A gap (or a repair): the log has the missing events.
			if next, err = s.events.LoadFrom(ctx, id, from+1); err != nil {
				err = fmt.Errorf("fill gap of %s after v%d: %w", id, from, err)
				if passes(err) {
					return out, nil, err
				}
				// The same read fails the same way on every redelivery
				// (a commit of a newer writer: domain.ErrUnreadableCommit):
				// parked like any poison event, not retried for ever.
				return out, &PoisonError{Reached: from, Err: err}, nil
			}
			if round == 0 {
				out.GapsFilled++
			}
			if !contiguous(next, from+1) || len(next) == 0 || next[len(next)-1].Version < target {
				return out, &PoisonError{Reached: from, Err: fmt.Errorf("fill gap of %s after v%d: the log does not hold v%d", id, from, target)}, nil
			}
		}
		doc := cur.doc
		applied := 0
		var bad error
		for _, e := range next {
			if err := s.def.Apply(&doc, e); err != nil {
				bad = fmt.Errorf("%s: apply %s v%d of %s: %w", s.def.Name, e.Type, e.Version, id, err)
				break
			}
			applied++
		}
		if bad != nil {
			// Keep what applied: the events before the bad one are good,
			// and doc holds exactly them (Apply changes nothing on error).
			if applied > 0 {
				if cur, err = s.write(ctx, id, doc); err != nil {
					return out, nil, err
				}
				out.Applied += applied
			}
			return out, &PoisonError{Reached: s.def.Version(&cur.doc), Err: bad}, nil
		}
		if cur, err = s.write(ctx, id, doc); err != nil {
			return out, nil, err
		}
		out.Applied += len(next)
		if round > 0 {
			out.Repairs++
			s.metrics.repair(s.def.Name)
		}
	}
}

// passes reports an error of a log read that may pass on a redelivery:
// the store cannot be reached, or this process is stopping. Anything else
// the log answers it will answer again.
func passes(err error) bool {
	return errors.Is(err, domain.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// PoisonError is a stream's events that cannot be applied. Reached is the
// version the stream's document reflects despite them: events up to it
// were applied and may be acknowledged.
type PoisonError struct {
	Reached int64
	Err     error
}

func (e *PoisonError) Error() string { return e.Err.Error() }
func (e *PoisonError) Unwrap() error { return e.Err }

// read returns a stream's document and attempted version; the zero entry
// when there is none.
func (s *ReadModel[D]) read(ctx context.Context, id string) (entry[D], error) {
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return entry[D]{}, nil
	}
	if err != nil {
		return entry[D]{}, fmt.Errorf("%s: read %s: %w", s.def.Name, id, mongoerr.Translate(err))
	}
	e := entry[D]{doc: d.Doc, attempted: d.Attempted}
	s.cache.Add(id, e)
	return e, nil
}

// write sets the document to doc and $max-es attempted to its version, in
// one operation by _id, and returns the document as written.
func (s *ReadModel[D]) write(ctx context.Context, id string, doc D) (entry[D], error) {
	return s.writeDoc(ctx, id, doc, "$max")
}

// writeDoc is write, with attempted updated by op: "$max" (a live write)
// or "$set" (a repair, which may lower a corrupted register).
func (s *ReadModel[D]) writeDoc(ctx context.Context, id string, doc D, op string) (entry[D], error) {
	raw, err := marshalJSONTags(doc)
	if err != nil {
		return entry[D]{}, fmt.Errorf("%s: encode %s: %w", s.def.Name, id, err)
	}
	set, present := bson.D{}, map[string]bool{"_id": true, "attempted": true}
	elems, err := raw.Elements()
	if err != nil {
		return entry[D]{}, err
	}
	for _, el := range elems {
		if k := el.Key(); !present[k] {
			present[k] = true
			set = append(set, bson.E{Key: k, Value: el.Value()})
		}
	}
	var update bson.D
	if op == "$set" {
		set = append(set, bson.E{Key: "attempted", Value: s.def.Version(&doc)})
		update = bson.D{{Key: "$set", Value: set}}
	} else {
		update = bson.D{{Key: "$set", Value: set}, {Key: "$max", Value: bson.D{{Key: "attempted", Value: s.def.Version(&doc)}}}}
	}
	unset := bson.D{}
	for _, f := range s.fields {
		if !present[f] {
			unset = append(unset, bson.E{Key: f, Value: ""})
		}
	}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	var d stored[D]
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)
	err = s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}}, update, opts).Decode(&d)
	if mongo.IsDuplicateKeyError(err) {
		// Two first writes raced to insert the document; now it exists.
		err = s.coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}}, update, opts).Decode(&d)
	}
	if err != nil {
		s.cache.Remove(id)
		return entry[D]{}, fmt.Errorf("%s: write %s: %w", s.def.Name, id, mongoerr.Translate(err))
	}
	e := entry[D]{doc: d.Doc, attempted: d.Attempted}
	s.cache.Add(id, e)
	return e, nil
}

func contiguous(evs []domain.Event, from int64) bool {
	for i, e := range evs {
		if e.Version != from+int64(i) {
			return false
		}
	}
	return true
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

// jsonFields lists the top-level JSON field names of struct type D.
func jsonFields[D any]() []string {
	t := reflect.TypeFor[D]()
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out = append(out, name)
	}
	return out
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
		return d.Doc, fmt.Errorf("%s %s: %w", s.def.Name, id, mongoerr.Translate(err))
	}
	return d.Doc, nil
}
