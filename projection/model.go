package projection

import (
	"context"
	"sync"
	"time"

	"github.com/orderd/orderd/domain"
)

// Model is one projection of one document per stream as the service runs
// it: its Definition, the pointer that says which collection readers read,
// and a ReadModel per collection in use. Live events go to a rebuild's
// shadow and the collection a switch replaced, then to the active one
// (ApplyAll); readers read the active one (the MongoDB adapter's
// Reader). The storage is Store's; Model
// holds the fold, the loop over a delivery, the rebuild's writes
// (WriteFolds), verify (Verify, VerifySums) and the check of one
// document (Check).
type Model[D any] struct {
	def      Definition[D]
	store    Store[D]
	log      Log
	metrics  *Metrics
	pointers Pointers

	mu     sync.Mutex
	models map[string]*ReadModel[D]
}

// WriterPointerAge is how old a pointer a writer may act on: it re-reads
// it before a batch (one _id look-up) unless it read it less than this
// ago, so a rebuild's shadow is written by every projector within this
// of its announcement. A rebuild's settling time must be longer
// (ApplyAll).
const WriterPointerAge = 100 * time.Millisecond

// ReaderPointerAge is how old a pointer readers (the REST queries, a
// check of one document) may act on.
const ReaderPointerAge = time.Second

// NewModel returns the projection def kept in store, its pointer read
// through ps, filling gaps from log. m may be nil; the projection's
// counters in it are created at once, at 0.
func NewModel[D any](def Definition[D], store Store[D], log Log, m *Metrics, ps Pointers) *Model[D] {
	m.Init(def.Name)
	return &Model[D]{def: def, store: store, log: log, metrics: m, pointers: ps, models: map[string]*ReadModel[D]{}}
}

// Name is the projection's name.
func (p *Model[D]) Name() string { return p.def.Name }

// Version is the version of the projection's definition this process
// folds (Definition.Ver).
func (p *Model[D]) Version() int { return p.def.Ver() }

// Collection is the definition's base collection: the first version's
// read model, and the prefix of rebuilt collections' names.
func (p *Model[D]) Collection() string { return p.def.Collection }

// ReadModel returns the read model in collection coll of this projection.
func (p *Model[D]) ReadModel(coll string) *ReadModel[D] {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.models[coll]; ok {
		return s
	}
	s := NewReadModel(p.def, coll, p.store, p.log, p.metrics)
	p.models[coll] = s
	return s
}

// forget drops the read models of collections the pointer no longer
// names.
func (p *Model[D]) forget(ptr Pointer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.models {
		if !ptr.Names(c) {
			delete(p.models, c)
		}
	}
}

// Pointer returns the projection's pointer, at most maxAge old.
func (p *Model[D]) Pointer(ctx context.Context, maxAge time.Duration) (Pointer, error) {
	return p.pointers.Get(ctx, p.def.Name, p.def.Collection, maxAge)
}

// EnsureIndexes creates the indexes of the collections this version
// writes (the active one, a shadow, a previous one), as the pointer names
// them now. Errors: domain.ErrUnavailable.
func (p *Model[D]) EnsureIndexes(ctx context.Context) error {
	ptr, err := p.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	for _, c := range ptr.Collections(p.def.Ver()) {
		if err := p.ReadModel(c).EnsureIndexes(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Apply folds events (any streams, any order, duplicates allowed) into
// every collection of this process's version the pointer names, each in
// one batch write (ApplyAll says in which order, and what the results
// are). fresh reads every document from the store instead of trusting
// this process's cache: set it for redeliveries, and for a partition just
// taken over, whose documents another process may have written. Errors:
// domain.ErrUnavailable, a cancelled ctx; then nothing is known to be
// written, in any collection, and every event must be applied again.
func (p *Model[D]) Apply(ctx context.Context, events []domain.Event, fresh bool) (Outcome, map[string]error, error) {
	ptr, err := p.Pointer(ctx, WriterPointerAge)
	if err != nil {
		return Outcome{}, nil, err
	}
	p.forget(ptr)
	return ApplyAll(ptr, p.def.Ver(), func(coll string) (Outcome, map[string]error, error) {
		return p.ReadModel(coll).apply(ctx, events, fresh)
	})
}
