package jobs

import (
	"context"
	"time"

	"github.com/orderd/orderd/projection"
)

// Pointers keeps the projections' pointer documents (projection.Pointer)
// and the collections they replaced, waiting to be dropped; the jobs read
// and move the pointers and retire what a switch or a failed rebuild
// leaves. The MongoDB adapter's *mongodb.Pointers implements it.
// Projections are named by projection.Definition.Name, collection by
// their projection.Definition.Collection, the base collection. Every
// method fails with domain.ErrUnavailable when the store cannot be
// reached.
type Pointers interface {
	// Get returns the pointer of projection name, read from the store
	// unless this process read it less than maxAge ago; a projection never
	// rebuilt points at collection, at generation 0.
	Get(ctx context.Context, name, collection string, maxAge time.Duration) (projection.Pointer, error)
	// Update reads the pointer of projection name from the store, lets
	// change edit it, and stores the result at the next generation, a
	// compare-and-set on the generation read. change returns false when
	// the pointer needs no write, or an error to stop; it is called again
	// on a fresh read when another write moved the pointer in between, a
	// few times. It returns the pointer as stored, or as read when
	// nothing was written. Errors: change's, domain.ErrPointerMoved
	// (wrapped) when every compare-and-set was lost.
	Update(ctx context.Context, name, collection string, change func(p *projection.Pointer) (bool, error)) (projection.Pointer, error)
	// Retire schedules the drop of collection, a former collection of
	// projection, at after (this process's clock).
	Retire(ctx context.Context, projection, collection, reason string, after time.Time) error
	// DropAfter returns when a retired collection is to be dropped, and
	// false when it is not retired.
	DropAfter(ctx context.Context, collection string) (time.Time, bool, error)
	// Unretire takes collection off the collections to drop.
	Unretire(ctx context.Context, collection string) error
	// DropRetired drops the retired collections whose time has come by
	// now, except any a pointer names as active or shadow, and returns
	// their names, with those dropped before a failure.
	DropRetired(ctx context.Context, now time.Time) ([]string, error)
	// RetireProjection schedules every collection of projection name,
	// which the service no longer runs, for dropping at after and deletes
	// its pointer; a projection without a pointer is retired already.
	RetireProjection(ctx context.Context, name string, after time.Time) error
}
