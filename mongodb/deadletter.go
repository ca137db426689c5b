package mongodb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projector"
)

// DeadLettersCollection holds the events a projection could not apply,
// one document per event (deadLetterDoc): {_id: "<projection>:<event
// id>", projection, stream_id, event_id, version, subject, payload,
// error, deliveries, parked_at, stream_seq, retried_at, retry_result}.
const DeadLettersCollection = "dead_letters"

// DeadLetters is the dead-letter collection: the projectors park there
// the events they could not apply, and operators list and retry them.
type DeadLetters struct {
	coll *mongo.Collection
}

// NewDeadLetters returns the dead-letter collection of db.
func NewDeadLetters(db *mongo.Database) *DeadLetters {
	return &DeadLetters{coll: db.Collection(DeadLettersCollection)}
}

// Park stores d; parking the same event again overwrites it.
func (s *DeadLetters) Park(ctx context.Context, d projector.DeadLetter) error {
	_, err := s.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: d.ID}}, deadLetterDoc(d), options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("park %s: %w", d.ID, Translate(err))
	}
	return nil
}

// List returns up to limit dead letters of a projection ("" for all),
// oldest first.
func (s *DeadLetters) List(ctx context.Context, projection string, limit int64) ([]projector.DeadLetter, error) {
	filter := bson.D{}
	if projection != "" {
		filter = bson.D{{Key: "projection", Value: projection}}
	}
	docs, err := findAll[deadLetterDoc](ctx, s.coll, filter, options.Find().SetSort(bson.D{{Key: "parked_at", Value: 1}}).SetLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out := make([]projector.DeadLetter, len(docs))
	for i, d := range docs {
		out[i] = projector.DeadLetter(d)
	}
	return out, nil
}

// Count returns the number of dead letters of a projection.
func (s *DeadLetters) Count(ctx context.Context, projection string) (int64, error) {
	n, err := s.coll.CountDocuments(ctx, bson.D{{Key: "projection", Value: projection}})
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", Translate(err))
	}
	return n, nil
}

// Retry re-applies a parked event through apply, which folds the stream
// from the log up to the event (so a fixed cause of failure heals the
// document). On success the dead letter is deleted; on failure it stays,
// with the new error. Errors: domain.ErrNotFound for an unknown id.
func (s *DeadLetters) Retry(ctx context.Context, id string, apply func(context.Context, []domain.Event) error) error {
	d, found, err := findOne[deadLetterDoc](ctx, s.coll, bson.D{{Key: "_id", Value: id}})
	if err == nil && !found {
		err = domain.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("dead letter %s: %w", id, err)
	}
	e, err := domain.UnmarshalEvent([]byte(d.Payload))
	if err == nil {
		err = apply(ctx, []domain.Event{e})
	}
	if err != nil {
		_, uerr := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{
			{Key: "retried_at", Value: time.Now().UTC()}, {Key: "retry_result", Value: err.Error()}}}})
		if errors.Is(err, domain.ErrUnavailable) {
			return errors.Join(fmt.Errorf("retry %s: %w", id, err), Translate(uerr))
		}
		return errors.Join(fmt.Errorf("retry %s: %w: %w", id, domain.ErrRetryFailed, err), Translate(uerr))
	}
	if _, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
		return fmt.Errorf("retry %s: delete: %w", id, Translate(err))
	}
	return nil
}

// deadLetterDoc is a dead letter as stored in DeadLettersCollection. It
// has projector.DeadLetter's fields, so the two convert into each other and
// a field added to one and not the other does not compile.
type deadLetterDoc struct {
	ID          string    `bson:"_id"`
	Projection  string    `bson:"projection"`
	StreamID    string    `bson:"stream_id"`
	EventID     string    `bson:"event_id,omitempty"`
	Version     int64     `bson:"version,omitempty"`
	Subject     string    `bson:"subject"`
	Payload     string    `bson:"payload"`
	Error       string    `bson:"error"`
	Deliveries  uint64    `bson:"deliveries"`
	ParkedAt    time.Time `bson:"parked_at"`
	StreamSeq   uint64    `bson:"stream_seq"`
	RetriedAt   time.Time `bson:"retried_at,omitempty"`
	RetryResult string    `bson:"retry_result,omitempty"`
}
