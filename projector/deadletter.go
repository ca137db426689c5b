package projector

import (
	"context"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// DeadLetterStore keeps the events a projection could not apply. The
// MongoDB adapter's *mongodb.DeadLetters implements it.
type DeadLetterStore interface {
	// Park stores d; parking the same event again overwrites it.
	Park(ctx context.Context, d domain.DeadLetter) error
	// Count returns the number of dead letters of a projection.
	Count(ctx context.Context, projection string) (int64, error)
	// Retry re-applies a parked event through apply, deleting it on
	// success; domain.ErrNotFound for an unknown id.
	Retry(ctx context.Context, id string, apply func(context.Context, []domain.Event) error) error
}

var _ DeadLetterStore = (*mongodb.DeadLetters)(nil)
