package jobs

import (
	"context"
	"time"

	"github.com/orderd/orderd/projection"
)

// Pointers keeps the projections' pointer documents (projection.Pointers)
// and the collections they replaced, waiting to be dropped; the jobs read
// and move the pointers and retire what a switch or a failed rebuild
// leaves. The MongoDB adapter's *mongodb.Pointers implements it.
// Projections are named by projection.Definition.Name, collection by
// their projection.Definition.Collection, the base collection. Every
// method fails with domain.ErrUnavailable when the store cannot be
// reached.
type Pointers interface {
	projection.Pointers
	// Retire schedules the drop of collection, a former collection of
	// projection, at after (this process's clock).
	Retire(ctx context.Context, projection, collection, reason string, after time.Time) error
	// DropAfter returns when a retired collection is to be dropped, and
	// false when it is not retired.
	DropAfter(ctx context.Context, collection string) (time.Time, bool, error)
	// Unretire takes collection off the collections to drop.
	Unretire(ctx context.Context, collection string) error
	// Drop drops collection now; one that does not exist is no error. It
	// stays on the drop list if it is there.
	Drop(ctx context.Context, collection string) error
	// DropRetired drops the retired collections whose time has come by
	// now, except any a pointer names as active or shadow, and returns
	// their names, with those dropped before a failure.
	DropRetired(ctx context.Context, now time.Time) ([]string, error)
	// RetireProjection schedules every collection of projection name,
	// which the service no longer runs, for dropping at after and deletes
	// its pointer; a projection without a pointer is retired already.
	RetireProjection(ctx context.Context, name string, after time.Time) error
}
