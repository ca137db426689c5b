package mongodb

import (
	"context"
	"sync"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// used holds the dialects UseDialect set, by client.
var used sync.Map // *mongo.Client -> Dialect

func init() {
	askDialect = func(ctx context.Context, c *mongo.Client) (Dialect, error) {
		if d, ok := used.Load(c); ok {
			return d.(Dialect), nil
		}
		return DialectOf(ctx, c)
	}
}

// UseDialect makes every adapter on c that has not asked its store yet
// take d's access paths, whatever the store: the conformance suites run
// MongoDB's paths on the embedded store this way (correct there, only
// slower).
func UseDialect(c *mongo.Client, d Dialect) { used.Store(c, d) }

// WithIDBudget makes a pass of scanByID (the FerretDB dialect's scan)
// hold about n commit ids.
func WithIDBudget(n int) EventStoreOption { return func(s *EventStore) { s.idBudget = n } }

// HoldAppends makes s act as if an insert were in flight, so appends
// queue, until release hands them on as the insert's return would. Call
// it while no append is under way.
func HoldAppends(s *EventStore) (release func()) {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	if s.group.writing {
		panic("HoldAppends with an insert in flight")
	}
	s.group.writing = true
	return func() { s.group.next(MaxAppendBatch) }
}

// QueuedAppends is how many appends wait for the insert in flight.
func QueuedAppends(s *EventStore) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// SetStatsPage makes r read a customer's summaries for the stats n at a
// time.
func SetStatsPage(r *Reader, n int) { r.statsPage = n }

// NewLeases returns the leases kept in collection of db, as a Lease holds
// them.
func NewLeases(db *mongo.Database, collection string) *Leases {
	return newLeases(db, collection, "expires_at")
}
