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
)

// PointersCollection holds one pointer document per projection, naming the
// collection readers read (active) and, during a rebuild, the shadow
// collection live events are also written to. A projection with no
// pointer document reads its projection.Definition's Collection.
const PointersCollection = "projection_pointers"

// RetiredCollection lists collections a rebuild replaced (or a failed one
// left behind), each dropped once its drop_after time has passed.
const RetiredCollection = "projection_retired"

// Pointer is a projection's pointer document. Only the runner of the
// projection's one rebuild should write it (the rebuild lock makes it
// one), but a runner that stalled may wake up after its lease passed on:
// every write is therefore a compare-and-set on Generation, which each
// write increments.
type Pointer struct {
	Projection string    `bson:"_id" json:"projection"`
	Active     string    `bson:"active" json:"active_collection"`
	Shadow     string    `bson:"shadow,omitempty" json:"shadow_collection,omitempty"`
	ShadowJob  string    `bson:"shadow_job,omitempty" json:"shadow_job,omitempty"`
	Generation int64     `bson:"generation" json:"generation"`
	SwitchedAt time.Time `bson:"switched_at,omitempty" json:"switched_at,omitzero"`
}

// Pointers reads and writes pointer documents, caching reads per process.
type Pointers struct {
	coll    *mongo.Collection
	retired *mongo.Collection

	mu    sync.Mutex
	cache map[string]cachedPointer
}

type cachedPointer struct {
	p  Pointer
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
func (ps *Pointers) Get(ctx context.Context, name, collection string, maxAge time.Duration) (Pointer, error) {
	return ps.get(ctx, name, collection, maxAge, false)
}

// Last is Get for readers: when the read fails it returns the pointer this
// process read last, if any, so a store that is away for a moment keeps
// serving reads from what it served.
func (ps *Pointers) Last(ctx context.Context, name, collection string, maxAge time.Duration) (Pointer, error) {
	return ps.get(ctx, name, collection, maxAge, true)
}

func (ps *Pointers) get(ctx context.Context, name, collection string, maxAge time.Duration, orLast bool) (Pointer, error) {
	ps.mu.Lock()
	c, ok := ps.cache[name]
	ps.mu.Unlock()
	if ok && time.Since(c.at) < maxAge {
		return c.p, nil
	}
	var p Pointer
	err := ps.coll.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&p)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		p = Pointer{Projection: name, Active: collection}
	case err != nil:
		if ok && orLast {
			return c.p, nil
		}
		return Pointer{}, fmt.Errorf("pointer of %s: %w", name, Translate(err))
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
// domain.ErrValidation for a generation below 1, domain.ErrUnavailable.
func (ps *Pointers) put(ctx context.Context, p Pointer) error {
	read := p.Generation - 1
	if read < 0 {
		return fmt.Errorf("pointer of %s at generation %d: %w", p.Projection, p.Generation, domain.ErrValidation)
	}
	var moved bool
	if read == 0 {
		// No document was read: another writer's insert since then is a
		// duplicate key.
		_, err := ps.coll.InsertOne(ctx, p)
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("pointer of %s at generation %d: %w", p.Projection, read, Translate(err))
		}
		moved = err != nil
	} else {
		res, err := ps.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: p.Projection}, {Key: "generation", Value: read}}, p)
		if err != nil {
			return fmt.Errorf("pointer of %s at generation %d: %w", p.Projection, read, Translate(err))
		}
		moved = res.MatchedCount == 0
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
func (ps *Pointers) Update(ctx context.Context, name, collection string, change func(p *Pointer) (bool, error)) (Pointer, error) {
	for attempt := 1; ; attempt++ {
		p, err := ps.Get(ctx, name, collection, 0)
		if err != nil {
			return Pointer{}, err
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

// DropRetired drops the retired collections whose time has come by now,
// except any a pointer still names, and returns their names. Errors:
// domain.ErrUnavailable, with the names dropped before the failure.
func (ps *Pointers) DropRetired(ctx context.Context, now time.Time) ([]string, error) {
	cur, err := ps.retired.Find(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("list retired collections: %w", Translate(err))
	}
	var docs []retiredDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("list retired collections: %w", Translate(err))
	}
	var dropped []string
	for _, d := range docs {
		if now.Before(d.DropAfter) {
			continue
		}
		var p Pointer
		err := ps.coll.FindOne(ctx, bson.D{{Key: "_id", Value: d.Projection}}).Decode(&p)
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			return dropped, fmt.Errorf("pointer of %s: %w", d.Projection, Translate(err))
		}
		if err == nil && (p.Active == d.Collection || p.Shadow == d.Collection) {
			// In use again (a pointer never goes back, but be safe).
			_, _ = ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.Collection}})
			continue
		}
		if err := ps.coll.Database().Collection(d.Collection).Drop(ctx); err != nil {
			return dropped, fmt.Errorf("drop %s: %w", d.Collection, Translate(err))
		}
		if _, err := ps.retired.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.Collection}}); err != nil {
			return dropped, fmt.Errorf("forget %s: %w", d.Collection, Translate(err))
		}
		dropped = append(dropped, d.Collection)
	}
	return dropped, nil
}
