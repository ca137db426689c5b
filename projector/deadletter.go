package projector

import (
	"context"

	"github.com/orderd/orderd/domain"
)

// DeadLetterStore keeps the events a projection could not apply. The
// MongoDB adapter's *mongodb.DeadLetters implements it. Besides the
// errors named below, each method fails with domain.ErrUnavailable when
// the store cannot be reached.
type DeadLetterStore interface {
	// Park stores d; parking the same event again overwrites it.
	Park(ctx context.Context, d domain.DeadLetter) error
	// Count returns the number of dead letters of a projection.
	Count(ctx context.Context, projection string) (int64, error)
	// Retry re-applies a parked event through apply, deleting it on
	// success; domain.ErrNotFound for an unknown id.
	Retry(ctx context.Context, id string, apply func(context.Context, []domain.Event) error) error
}
