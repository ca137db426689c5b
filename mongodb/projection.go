package mongodb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// Projection is one read model as the service runs it: its projection.Definition, the
// pointer that says which collection is active, and a ReadModel per collection
// in use. Live events go to the shadow collection (during a rebuild) and
// then to the active one; readers read the active one.
type Projection[D any] struct {
	def      projection.Definition[D]
	db       *mongo.Database
	events   EventLog
	metrics  *projection.Metrics
	pointers *Pointers

	mu     sync.Mutex
	stores map[string]*ReadModel[D]
}

// How old a pointer each side may act on. Writers re-read it before every
// batch (one _id look-up), so a rebuild's shadow is written by every
// projector within a batch of its announcement; readers re-read it every
// second. (Variables for the test that holds a writer's pointer.)
var (
	writerPointerAge = 100 * time.Millisecond
	readerPointerAge = time.Second
)

// NewProjection returns the projection def in db. events fills gaps; m may be
// nil. The projection's counters in m are created at once, at 0.
func NewProjection[D any](db *mongo.Database, def projection.Definition[D], events EventLog, m *projection.Metrics, ps *Pointers) *Projection[D] {
	m.Init(def.Name)
	return &Projection[D]{def: def, db: db, events: events, metrics: m, pointers: ps, stores: map[string]*ReadModel[D]{}}
}

// Name is the projection's name.
func (p *Projection[D]) Name() string { return p.def.Name }

// Version is the version of the projection's definition this process
// folds (projection.Definition.Ver).
func (p *Projection[D]) Version() int { return p.def.Ver() }

// Key names this version's consumers and leases (projection.Definition.Key).
func (p *Projection[D]) Key() string { return p.def.Key() }

// Collection is the definition's base collection: the first version's
// read model, and the prefix of rebuilt collections' names.
func (p *Projection[D]) Collection() string { return p.def.Collection }

// ReadModel returns the read model in collection coll of this projection.
func (p *Projection[D]) ReadModel(coll string) *ReadModel[D] {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.stores[coll]; ok {
		return s
	}
	def := p.def
	def.Collection = coll
	s := NewReadModel(p.db, def, p.events, p.metrics)
	p.stores[coll] = s
	return s
}

// forget drops the stores of collections the pointer no longer names.
func (p *Projection[D]) forget(ptr projection.Pointer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.stores {
		if !ptr.Names(c) {
			delete(p.stores, c)
		}
	}
}

// Purge empties the document cache of every collection of the projection
// this process writes. Call it before writing streams that another
// process may have written since this one last did (a partition taken
// over): a write started from a stale cached document would be caught by
// the version guard, but only after it had shown readers an older version
// and cost a second write.
func (p *Projection[D]) Purge() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stores {
		s.purge()
	}
}

// Pointer returns the projection's pointer, at most maxAge old.
func (p *Projection[D]) Pointer(ctx context.Context, maxAge time.Duration) (projection.Pointer, error) {
	return p.pointers.Get(ctx, p.def.Name, p.def.Collection, maxAge)
}

// Active returns the store of the collection readers read, whatever its
// version. Errors: domain.ErrNotBuilt before a first build has switched
// to a collection, domain.ErrUnavailable.
func (p *Projection[D]) Active(ctx context.Context) (*ReadModel[D], error) {
	ptr, err := p.pointers.Last(ctx, p.def.Name, p.def.Collection, readerPointerAge)
	if err != nil {
		return nil, err
	}
	if ptr.Active == "" {
		return nil, fmt.Errorf("%s: %w", p.def.Name, domain.ErrNotBuilt)
	}
	return p.ReadModel(ptr.Active), nil
}

// EnsureIndexes creates the indexes of the collections this version
// writes (the active one, a shadow, a previous one).
func (p *Projection[D]) EnsureIndexes(ctx context.Context) error {
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

// EnsurePointer writes the projection's first pointer document when it
// has none, so that every process agrees on what readers read: the base
// collection, at version 1 when it holds documents (a store from before
// versions) or at this definition's version when the log is empty (a new
// store); otherwise (a projection added to a service whose log holds
// events) no collection, until the first build switches to one, and
// readers get domain.ErrNotBuilt meanwhile. Call it before serving reads.
// Errors: domain.ErrUnavailable.
func (p *Projection[D]) EnsurePointer(ctx context.Context) error {
	ptr, err := p.Pointer(ctx, 0)
	if err != nil || ptr.Generation > 0 {
		return err
	}
	n, err := p.db.Collection(p.def.Collection).CountDocuments(ctx, bson.D{}, options.Count().SetLimit(1))
	if err != nil {
		return fmt.Errorf("%s: %w", p.def.Collection, Translate(err))
	}
	first := projection.Pointer{Projection: p.def.Name, Active: p.def.Collection, ActiveVersion: 1, Generation: 1}
	if n == 0 {
		commits, err := p.db.Collection(CommitsCollection).CountDocuments(ctx, bson.D{}, options.Count().SetLimit(1))
		if err != nil {
			return fmt.Errorf("%s: %w", CommitsCollection, Translate(err))
		}
		if commits == 0 {
			first.ActiveVersion = p.def.Ver()
		} else {
			first.Active, first.ActiveVersion = "", 0
		}
	}
	if err := p.pointers.put(ctx, first); err != nil && !errors.Is(err, domain.ErrPointerMoved) {
		return err
	}
	return nil
}

// Apply folds events (any streams, any order, duplicates allowed) into
// every collection of this process's version the pointer names, each in
// one batch write (projection.ApplyAll says in which order, and what the
// results are). fresh reads every document from the store instead of
// trusting this process's cache: set it for redeliveries, whose documents
// another process may have written. Errors: domain.ErrUnavailable, a
// cancelled ctx; then nothing is known to be written, in any collection,
// and every event must be applied again.
func (p *Projection[D]) Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error) {
	return projection.ApplyAll(ctx, collections[D]{p, fresh}, p.def.Ver(), writerPointerAge, events)
}

// collections is a Projection as projection.ApplyAll writes a delivery
// into it.
type collections[D any] struct {
	p     *Projection[D]
	fresh bool
}

// Pointer reads the pointer, and forgets the stores of the collections it
// no longer names.
func (c collections[D]) Pointer(ctx context.Context, maxAge time.Duration) (projection.Pointer, error) {
	ptr, err := c.p.Pointer(ctx, maxAge)
	if err == nil {
		c.p.forget(ptr)
	}
	return ptr, err
}

// ApplyTo loads the documents of the events' streams in coll (this
// process's cache first), advances each (projection.Definition.Advance)
// and stores them in one bulk write of version-guarded replacements.
func (c collections[D]) ApplyTo(ctx context.Context, coll string, events []domain.Event) (projection.Outcome, map[string]error, error) {
	return c.p.ReadModel(coll).apply(ctx, events, c.fresh)
}

// Get returns one document of the active collection, or an error wrapping
// domain.ErrNotFound.
func (p *Projection[D]) Get(ctx context.Context, id string) (D, error) {
	s, err := p.Active(ctx)
	if err != nil {
		var zero D
		return zero, err
	}
	return s.Get(ctx, id)
}
