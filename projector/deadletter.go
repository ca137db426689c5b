package projector

import (
	"context"
	"time"

	"github.com/orderd/orderd/domain"
)

// DeadLetterStore keeps the events a projection could not apply. The
// MongoDB adapter's *mongodb.DeadLetters implements it. Besides the
// errors named below, each method fails with domain.ErrUnavailable when
// the store cannot be reached.
type DeadLetterStore interface {
	// Park stores d; parking the same event again overwrites it.
	Park(ctx context.Context, d DeadLetter) error
	// Count returns the number of dead letters of a projection.
	Count(ctx context.Context, projection string) (int64, error)
	// Retry re-applies a parked event through apply, deleting it on
	// success; domain.ErrNotFound for an unknown id.
	Retry(ctx context.Context, id string, apply func(context.Context, []domain.Event) error) error
}

// DeadLetter is a parked event: the raw message, why it failed, and how
// often it was delivered. ID is "<projection>:<event id or stream
// sequence>".
type DeadLetter struct {
	ID          string    `json:"id"`
	Projection  string    `json:"projection"`
	StreamID    string    `json:"stream_id"`
	EventID     string    `json:"event_id,omitempty"`
	Version     int64     `json:"version,omitempty"`
	Subject     string    `json:"subject"`
	Payload     string    `json:"payload"`
	Error       string    `json:"error"`
	Deliveries  uint64    `json:"deliveries"`
	ParkedAt    time.Time `json:"parked_at"`
	StreamSeq   uint64    `json:"stream_seq"`
	RetriedAt   time.Time `json:"retried_at,omitzero"`
	RetryResult string    `json:"retry_result,omitempty"`
}
