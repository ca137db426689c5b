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

// PointersCollection holds one pointer document per projection, naming the
// collection readers read (active), during a rebuild the shadow collection
// live events are also written to, and after a switch the collection it
// replaced (previous), kept for the rebuild grace so that an operator can
// switch back. Each collection is of one version of the projection's
// definition (projection.Definition.Version), and a projector writes only
// the collections of its own version. A projection with no pointer
// document reads its projection.Definition's Collection, at version 1.
const PointersCollection = "projection_pointers"

// RetiredCollection lists collections a rebuild replaced (or a failed one
// left behind), each dropped once its drop_after time has passed.
const RetiredCollection = "projection_retired"

// Pointers reads and writes pointer documents, caching reads per process.
type Pointers struct {
	coll    *mongo.Collection
	retired *mongo.Collection

	mu    sync.Mutex
	cache map[string]cachedPointer
}

type cachedPointer struct {
	p  projection.Pointer
	at time.Time
}

// NewPointers returns the pointer documents of db.
func NewPointers(db *mongo.Database) *Pointers {
	return &Pointers{coll: db.Collection(PointersCollection), retired: db.Collection(RetiredCollection), cache: map[string]cachedPointer{}}
}

// Get returns the pointer of the projection def, read from the store unless
// this process read it less than maxAge ago. A projection never rebuilt
// points at def.Collection. A cached pointer is only replaced by one of a
// higher generation, so one process never goes back to an older
// collection. When the read fails Get fails, however recent its cached
// copy: a writer acting on it could write a collection a rebuild has
// retired, and its upsert would re-create the collection after the drop,
// where nothing drops it again. Errors: domain.ErrUnavailable.
func (ps *Pointers) Get(ctx context.Context, name, collection string, maxAge time.Duration) (projection.Pointer, error) {
	return ps.get(ctx, name, collection, maxAge, false)
}

// Last is Get for readers: when the read fails it returns the pointer this
// process read last, if any, so a store that is away for a moment keeps
// serving reads from what it served.
func (ps *Pointers) Last(ctx context.Context, name, collection string, maxAge time.Duration) (projection.Pointer, error) {
	return ps.get(ctx, name, collection, maxAge, true)
}

func (ps *Pointers) get(ctx context.Context, name, collection string, maxAge time.Duration, orLast bool) (projection.Pointer, error) {
	ps.mu.Lock()
	c, ok := ps.cache[name]
	ps.mu.Unlock()
	if ok && time.Since(c.at) < maxAge {
		return c.p, nil
	}
	p, found, err := findOne[projection.Pointer](ctx, ps.coll, bson.D{{Key: "_id", Value: name}})
	switch {
	case err != nil && ok && orLast:
		return c.p, nil
	case err != nil:
		return projection.Pointer{}, fmt.Errorf("pointer of %s: %w", name, err)
	case !found:
		p = projection.Pointer{Projection: name, Active: collection}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if old, ok := ps.cache[name]; ok && old.p.Generation > p.Generation {
		p = old.p
	}
	ps.cache[name] = cachedPointer{p: p, at: time.Now()}
	return p, nil
}

// put stores p in place of the pointer at generation p.Generation-1, the
// one the caller read and changed (generation 1 is a projection's first
// pointer document, created by an insert), and caches it. It is a
// compare-and-set on the generation, so a writer that read the pointer
// before another write moved it on never overwrites that write. Errors:
// domain.ErrPointerMoved (wrapped) when the pointer is no longer at
// p.Generation-1 (re-read it and decide again, see Update),
// domain.ErrUnavailable.
func (ps *Pointers) put(ctx context.Context, p projection.Pointer) error {
	read := p.Generation - 1
	// At generation 0 no document was read: the write is an insert by
	// upsert, and another writer's insert since then is a duplicate key.
	// Later, a pointer deleted since it was read (RetireProjection) is
	// not re-created.
	res, err := ps.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: p.Projection}, {Key: "generation", Value: read}}, p,
		options.Replace().SetUpsert(read == 0))
	moved := mongo.IsDuplicateKeyError(err) || err == nil && res.MatchedCount == 0 && res.UpsertedCount == 0
	if err != nil && !moved {
		return fmt.Errorf("pointer of %s at generation %d: %w", p.Projection, read, Translate(err))
	}
	if moved {
		return fmt.Errorf("pointer of %s at generation %d: %w", p.Projection, read, domain.ErrPointerMoved)
	}
	ps.mu.Lock()
	if old, ok := ps.cache[p.Projection]; !ok || old.p.Generation <= p.Generation {
		ps.cache[p.Projection] = cachedPointer{p: p, at: time.Now()}
	}
	ps.mu.Unlock()
	return nil
}

// pointerAttempts bounds the compare-and-sets of one update. Only stalled
// writers of earlier rebuilds race the rebuild holding the lock, and each
// of them gives up once it sees the pointer moved on, so a few suffice.
const pointerAttempts = 3

// Update reads the pointer of projection name (collection: its
// projection.Definition's Collection) from the store, lets change edit it, and puts
// the result at the next generation. change returns false when the
// pointer needs no write, or an error to stop; it is called again on a
// fresh read when another write moved the pointer in between (a lost
// compare-and-set), up to pointerAttempts times. It returns the pointer
// as stored, or as read when nothing was written. Errors: change's,
// domain.ErrPointerMoved (wrapped) after pointerAttempts lost compare-and-sets,
// domain.ErrUnavailable.
func (ps *Pointers) Update(ctx context.Context, name, collection string, change func(p *projection.Pointer) (bool, error)) (projection.Pointer, error) {
	for attempt := 1; ; attempt++ {
		p, err := ps.Get(ctx, name, collection, 0)
		if err != nil {
			return projection.Pointer{}, err
		}
		write, err := change(&p)
		if err != nil || !write {
			return p, err
		}
		p.Generation++
		err = ps.put(ctx, p)
		if err == nil || !errors.Is(err, domain.ErrPointerMoved) || attempt == pointerAttempts {
			return p, err
		}
	}
}

// retiredDoc is a collection to drop after DropAfter.
type retiredDoc struct {
	Collection string    `bson:"_id"`
	Projection string    `bson:"projection"`
	DropAfter  time.Time `bson:"drop_after"`
	Reason     string    `bson:"reason"`
}

// Retire schedules the drop of collection, a former collection of
// projection, at after (the caller's clock). Errors: domain.ErrUnavailable.
func (ps *Pointers) Retire(ctx context.Context, projection, collection, reason string, after time.Time) error {
	d := retiredDoc{Collection: collection, Projection: projection, DropAfter: after.UTC(), Reason: reason}
	_, err := ps.retired.ReplaceOne(ctx, bson.D{{Key: "_id", Value: collection}}, d, options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("retire %s: %w", collection, Translate(err))
	}
	return nil
}

// RetireProjection retires projection name, which the service no longer
// runs (projection.Retired), whose collection name was its first: every
// collection its pointer names (active, shadow and its sums, previous),
// and name itself (its first collection), is scheduled for dropping at after, and then the pointer is
// deleted, so that DropRetired no longer spares them. Readers of the
// service that still run it (a rolling upgrade) read it until then. A
// projection without a pointer is retired already: nothing is done.
// Errors: domain.ErrUnavailable.
func (ps *Pointers) RetireProjection(ctx context.Context, name string, after time.Time) error {
	p, found, err := findOne[projection.Pointer](ctx, ps.coll, bson.D{{Key: "_id", Value: name}})
	if err != nil {
		return fmt.Errorf("retire projection %s: %w", name, err)
	}
	if !found {
		return nil
	}
	colls := []string{name, p.Active, p.Previous, p.Shadow}
	if p.Shadow != "" {
		colls = append(colls, projection.SumsCollection(p.Shadow))
	}
	// A collection named twice is retired twice: Retire is an upsert.
	for _, c := range colls {
		if c == "" {
			continue
		}
		if err := ps.Retire(ctx, name, c, "projection "+name+" retired", after); err != nil {
			return err
		}
	}
	if _, err := ps.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: name}, {Key: "generation", Value: p.Generation}}); err != nil {
		return fmt.Errorf("retire projection %s: %w", name, Translate(err))
	}
	return nil
}

// DropAfter returns when retired collection is to be dropped, and false
// when it is not retired. Errors: domain.ErrUnavailable.
func (ps *Pointers) DropAfter(ctx context.Context, collection string) (time.Time, bool, error) {
	d, found, err := findOne[retiredDoc](ctx, ps.retired, bson.D{{Key: "_id", Value: collection}})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("retired %s: %w", collection, err)
	}
	return d.DropAfter, found, nil
}

// Unretire takes collection off the list of collections to drop (it is
// active again after a switch back). Errors: domain.ErrUnavailable.
func (ps *Pointers) Unretire(ctx context.Context, collection string) error {
	if _, err := ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: collection}}); err != nil {
		return fmt.Errorf("unretire %s: %w", collection, Translate(err))
	}
	return nil
}

// DropRetired drops the retired collections whose time has come by now,
// except any a pointer names as active or shadow, and returns their names.
// A pointer's previous collection is unnamed first (a compare-and-set), so
// no switch back can reach a dropped collection. Errors:
// domain.ErrUnavailable, with the names dropped before the failure.
func (ps *Pointers) DropRetired(ctx context.Context, now time.Time) ([]string, error) {
	docs, err := findAll[retiredDoc](ctx, ps.retired, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("list retired collections: %w", err)
	}
	var dropped []string
	for _, d := range docs {
		if now.Before(d.DropAfter) {
			continue
		}
		p, found, err := findOne[projection.Pointer](ctx, ps.coll, bson.D{{Key: "_id", Value: d.Projection}})
		if err != nil {
			return dropped, fmt.Errorf("pointer of %s: %w", d.Projection, err)
		}
		if found && (p.Active == d.Collection || p.Shadow == d.Collection) {
			// In use again (switched back to).
			_, _ = ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.Collection}})
			continue
		}
		if found && p.Previous == d.Collection {
			// Its grace is over: no switch back to it from now on. The
			// compare-and-set loses to a switch back made meanwhile.
			p, err := ps.Update(ctx, d.Projection, p.Active, func(p *projection.Pointer) (bool, error) {
				if p.Previous != d.Collection {
					return false, nil
				}
				p.Previous, p.PreviousVersion = "", 0
				return true, nil
			})
			if err != nil {
				return dropped, err
			}
			if p.Active == d.Collection || p.Shadow == d.Collection {
				_, _ = ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.Collection}})
				continue
			}
		}
		if err := ps.Drop(ctx, d.Collection); err != nil {
			return dropped, err
		}
		if _, err := ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.Collection}}); err != nil {
			return dropped, fmt.Errorf("forget %s: %w", d.Collection, Translate(err))
		}
		dropped = append(dropped, d.Collection)
	}
	return dropped, nil
}

// Drop drops collection now; one that does not exist is no error. It
// stays on the drop list if it is there. Errors: domain.ErrUnavailable.
func (ps *Pointers) Drop(ctx context.Context, collection string) error {
	if err := ps.coll.Database().Collection(collection).Drop(ctx); err != nil {
		return fmt.Errorf("drop %s: %w", collection, Translate(err))
	}
	return nil
}

// Ensure writes the first pointer document of projection name (base: its
// base collection; version: the version of its definition this process
// folds) when it has none, so that every process agrees on what readers
// read: the base collection, at version 1 when it holds documents (a
// store from before versions) or at version when the log is empty (a new
// store); otherwise (a projection added to a service whose log holds
// events) no collection, until the first build switches to one, and
// readers get domain.ErrNotBuilt meanwhile. Call it before serving reads.
// Errors: domain.ErrUnavailable.
func (ps *Pointers) Ensure(ctx context.Context, name, base string, version int) error {
	ptr, err := ps.Get(ctx, name, base, 0)
	if err != nil || ptr.Generation > 0 {
		return err
	}
	db := ps.coll.Database()
	n, err := db.Collection(base).CountDocuments(ctx, bson.D{}, options.Count().SetLimit(1))
	if err != nil {
		return fmt.Errorf("%s: %w", base, Translate(err))
	}
	first := projection.Pointer{Projection: name, Active: base, ActiveVersion: 1, Generation: 1}
	if n == 0 {
		commits, err := db.Collection(CommitsCollection).CountDocuments(ctx, bson.D{}, options.Count().SetLimit(1))
		if err != nil {
			return fmt.Errorf("%s: %w", CommitsCollection, Translate(err))
		}
		if commits == 0 {
			first.ActiveVersion = version
		} else {
			first.Active, first.ActiveVersion = "", 0
		}
	}
	if err := ps.put(ctx, first); err != nil && !errors.Is(err, domain.ErrPointerMoved) {
		return err
	}
	return nil
}
