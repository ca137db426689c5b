package projection

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/domain"
)

// ReadModel is one collection of a projection of one document per
// stream, keeping invariant 4: Apply folds any delivery of events (late,
// twice, out of order) into the documents of their streams and stores
// them through the Store's version compare-and-set, so writers racing in
// any number of processes cannot lose an update and no late write moves a
// document back. An event at or below a document's version is skipped; a
// gap is filled from the log (Definition.Advance). Documents this process
// wrote are cached, so a batch usually reads nothing before writing.
type ReadModel[D any] struct {
	def     Definition[D]
	coll    string
	store   Store[D]
	log     Log
	metrics *Metrics
	cache   *lru.Cache[string, D]
}

// cacheSize is how many documents a ReadModel remembers.
const cacheSize = 100_000

// parallel is how many streams of a batch fill their gaps from the log at
// once.
const parallel = 4

// NewReadModel returns the read model of def in collection coll of store,
// filling gaps from log. m may be nil; the projection's counters in it
// are created at once, at 0.
func NewReadModel[D any](def Definition[D], coll string, store Store[D], log Log, m *Metrics) *ReadModel[D] {
	c, _ := lru.New[string, D](cacheSize)
	m.Init(def.Name)
	return &ReadModel[D]{def: def, coll: coll, store: store, log: log, metrics: m, cache: c}
}

// EnsureIndexes creates the definition's indexes on the collection.
func (s *ReadModel[D]) EnsureIndexes(ctx context.Context) error {
	return s.store.EnsureIndexes(ctx, s.coll, s.def.Indexes)
}

// Apply folds events (any streams, any order, duplicates allowed) into the
// read model (Definition.Advance) and stores the documents in one write.
// It returns what it did, the streams whose events cannot be applied
// (poison, a *PoisonError each: the caller parks them), and an error for
// failures that may pass (store unavailable): then nothing is known to be
// written and the caller redelivers. When both are nil every stream's
// document reflects at least the highest version given for it.
func (s *ReadModel[D]) Apply(ctx context.Context, events []domain.Event) (Outcome, map[string]error, error) {
	return s.apply(ctx, events, false)
}

// apply is Apply; fresh reads every document instead of trusting the
// cache (redeliveries, whose documents another process may have written).
func (s *ReadModel[D]) apply(ctx context.Context, events []domain.Event, fresh bool) (Outcome, map[string]error, error) {
	byStream := map[string][]domain.Event{}
	for _, e := range events {
		byStream[e.StreamID] = append(byStream[e.StreamID], e)
	}
	ids := slices.Sorted(maps.Keys(byStream))
	cur, err := s.current(ctx, ids, fresh)
	if err != nil {
		return Outcome{}, nil, err
	}
	var (
		mu     sync.Mutex
		out    Outcome
		writes []Doc[D]
		steps  []Step[D]
		poison = map[string]error{}
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for _, id := range ids {
		g.Go(func() error {
			st, o, err := s.def.Advance(gctx, s.log, id, cur[id], byStream[id])
			mu.Lock()
			defer mu.Unlock()
			out.Add(o)
			switch {
			case st.Events > 0:
				writes = append(writes, Doc[D]{ID: id, Doc: st.Doc})
				steps = append(steps, st)
			case st.Poison != nil:
				poison[id] = st.Poison
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		s.metrics.Record(s.def.Name, out)
		return out, nil, err
	}
	superseded, err := s.save(ctx, writes)
	if err != nil {
		return out, nil, err
	}
	for i, st := range steps {
		out.Applied += st.Events
		if st.Poison != nil {
			poison[writes[i].ID] = st.Poison
		}
	}
	out.Superseded = superseded
	s.metrics.Record(s.def.Name, out)
	return out, poison, nil
}

// current returns the documents of ids from the cache, reading the others
// (all of them when fresh); a stream without a document has none in the
// map. The document of a stream whose first event is in the batch is read
// too, though the fold from nothing would do: skipping those reads made
// write rounds shorter, and on the embedded store's one writer that cost
// 17 % of the commands per second for 60 ms of visible p99
// (docs/benchmarks.md, "Why a new stream's document is still read").
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
	read, err := s.store.Load(ctx, s.coll, missing)
	if err != nil {
		return nil, fmt.Errorf("%s: read %d documents of %s: %w", s.def.Name, len(missing), s.coll, err)
	}
	for id, d := range read {
		out[id] = d
		s.cache.Add(id, d)
	}
	return out, nil
}

// save stores docs through the version guard and caches them; it returns
// how many the guard refused (a newer version was stored: the write is
// done, and the document is read again when next needed), or an error
// that may pass, after which any of them may or may not be written.
func (s *ReadModel[D]) save(ctx context.Context, docs []Doc[D]) (superseded int, err error) {
	if len(docs) == 0 {
		return 0, nil
	}
	refused, err := s.store.Save(ctx, s.coll, docs)
	if err != nil {
		for _, d := range docs {
			s.cache.Remove(d.ID)
		}
		return 0, fmt.Errorf("%s: write %d documents of %s: %w", s.def.Name, len(docs), s.coll, err)
	}
	for i, d := range docs {
		if refused[i] {
			s.cache.Remove(d.ID)
		} else {
			s.cache.Add(d.ID, d.Doc)
		}
	}
	return len(refused), nil
}
