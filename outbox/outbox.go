package outbox

import (
	"context"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/lease"
)

// Log is the event log as the relay reads it. *mongodb.EventStore
// implements it.
type Log interface {
	// Tail follows the log's change stream from the position after (nil:
	// the log's end when the stream opens): it calls fn with each batch of
	// up to batch commits inserted after it, in commit order, and next,
	// the position after them; first with none once the stream is open
	// (next is where it opened), and again with none whenever about a
	// second passes with no new commit. It returns fn's error, ctx's, or
	// the stream's: one wrapping domain.ErrHistoryLost when it cannot
	// resume from after, domain.ErrUnavailable when the store cannot be
	// reached.
	Tail(ctx context.Context, after []byte, batch int, fn func(commits []domain.RecordedCommit, next []byte) error) error
	// RecordedSince calls fn with the commits recorded at or after since,
	// up to batch at a time, oldest first and each stream's in version
	// order.
	RecordedSince(ctx context.Context, since time.Time, batch int, fn func([]domain.RecordedCommit) error) error
	// OldestUnpublished returns the recorded time of the oldest commit
	// that no relay of an earlier version marked published; found is
	// false when there is none.
	OldestUnpublished(ctx context.Context) (at time.Time, found bool, err error)
}

// Publisher sends commits' events to the message bus and waits for their
// acks. *bus.Publisher implements it; tracing.Publisher decorates it.
type Publisher interface {
	// Send sends the events of each commit as they are (their wire form),
	// each event with its log position (positions[i] is that of commit
	// i's first event, the next ones follow on), and returns the wait for
	// their acks, which returns the indexes of the commits whose every
	// event was acknowledged within the given time (counted from the
	// send), and the stream sequence of the last event acknowledged, also
	// alongside an error. Rounds sent one after the other reach the bus in
	// that order whatever their waits.
	Send(ctx context.Context, commits []domain.RecordedCommit, positions []uint64, within time.Duration) func() (acked []int, lastSeq uint64, err error)
	// Positions returns the log positions of the events the bus has
	// stored since a time, by event id, and the highest of them, at least
	// floor: a catch-up from the log gives the events it publishes again
	// the positions they were published under.
	Positions(ctx context.Context, since time.Time, floor uint64) (byEvent map[string]uint64, top uint64, err error)
	// Connected reports whether the bus can be published to now.
	Connected() bool
	// CheckStream asks the stream published to whether it answers: nil
	// when it does, an error wrapping domain.ErrUnavailable when the bus
	// does not answer (its cluster electing a leader, an outage, this
	// connection down), another error when it answers that it cannot serve
	// this publisher (no such stream).
	CheckStream(ctx context.Context) error
}

// Lease is the relay's named claim, held by one instance at a time
// (invariant 6) and fenced by an epoch that every claim raises, with the
// relay's checkpoint kept beside it. *mongodb.Lease implements it.
type Lease interface {
	// TryAcquire renews the claim this instance holds or, holding none,
	// claims the lease, and reports whether this instance holds it.
	TryAcquire(ctx context.Context) (bool, error)
	// Release gives the lease up if this instance holds it, and returns
	// nil if it does not.
	Release(ctx context.Context) error
	// Checkpoint returns the checkpoint last saved; its Token is nil when
	// none was saved.
	Checkpoint(ctx context.Context) (Checkpoint, error)
	// SaveCheckpoint saves cp, fenced by the claim this
	// instance holds: an error wrapping domain.ErrLeaseLost when it holds
	// the lease no more.
	SaveCheckpoint(ctx context.Context, cp Checkpoint) error
	// Held returns the claim this instance holds, whose Epoch another
	// holder's claim would have raised, and false when it holds none.
	Held() (lease.Lease, bool)
}

// Checkpoint is where the relay has published up to: the change stream's
// position after the last commit acknowledged (Token, a BSON document),
// that commit's recorded time, and the log position and stream sequence
// of the last event acknowledged. A log position counts the events the
// relay has published, 1 for the first: every event has one, the same
// however often it is published again, so a consumer that needs every
// event once in order (a rollup) can tell a copy from a gap. The change
// stream gives the commits in one order from a checkpoint, however often
// it is resumed; a catch-up from the log (ErrHistoryLost, or a first
// start on a log that holds commits) reads the bus for the positions of
// the events it publishes again (Publisher.Positions) and numbers the
// others after the highest. A commit that cannot be read keeps its
// events' positions unpublished: a rollup that needs them stops and is
// built again (projection.ErrPositionsLost).
type Checkpoint struct {
	Token      []byte
	RecordedAt time.Time
	Position   uint64
	Seq        uint64
}

// RelayLease is the name of the lease under which one relay at a time
// tails the log, and beside which it keeps its checkpoint.
const RelayLease = "outbox-relay"

// Config tunes the relay. Zero values take the defaults in brackets.
type Config struct {
	// Owner is this instance's id, the owner of the relay lease; it names
	// the instance in logs.
	Owner string
	// BatchSize is the most commits one publish round takes [256].
	BatchSize int
	// AckTimeout bounds the sends and JetStream acks of one publish round
	// [10s]; a round takes at most LeaseTTL/4 besides, so the lease's
	// renewals stay on time.
	AckTimeout time.Duration
	// LeaseTTL is the lifetime of the relay lease's claims; the relay
	// renews it every TTL/3 [DefaultLeaseTTL]. A relay that dies is
	// followed by another within it.
	LeaseTTL time.Duration
	// CatchUpMargin is how far before its checkpoint's recorded time a
	// catch-up from the log starts [1m]: more than the clocks of the
	// appending instances may disagree plus the longest an append takes
	// from the time it records to its insert, so that every commit after
	// the checkpoint in commit order is recorded after the catch-up's
	// start.
	CatchUpMargin time.Duration
	// IdleCheckpoint is how often an idle relay saves the position its
	// change stream has reached with nothing to publish [30s], so that
	// the position it resumes from stays within the store's history (on
	// MongoDB, the oplog's window).
	IdleCheckpoint time.Duration
}

// DefaultLeaseTTL is the relay lease's lifetime when Config sets none.
const DefaultLeaseTTL = 10 * time.Second

// WithDefaults returns c with its zero fields set to the defaults in
// brackets, for a program that shows or checks them before NewRelay.
func (c Config) WithDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.CatchUpMargin <= 0 {
		c.CatchUpMargin = time.Minute
	}
	if c.IdleCheckpoint <= 0 {
		c.IdleCheckpoint = 30 * time.Second
	}
	return c
}
