package projector

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/mongo"

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

// DeadLettersCollection is mongodb.DeadLettersCollection.
//
// Deprecated: use mongodb.DeadLettersCollection.
const DeadLettersCollection = mongodb.DeadLettersCollection

// DeadLetters is mongodb.DeadLetters.
//
// Deprecated: use mongodb.DeadLetters.
type DeadLetters = mongodb.DeadLetters

// NewDeadLetters returns mongodb.NewDeadLetters(db).
//
// Deprecated: use mongodb.NewDeadLetters.
func NewDeadLetters(db *mongo.Database) *DeadLetters { return mongodb.NewDeadLetters(db) }
