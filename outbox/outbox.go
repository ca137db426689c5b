package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/orderd/orderd/domain"
)

// Commits is the event log's side of the outbox: the commits still
// unpublished, and their published markers. *mongodb.EventStore implements
// it.
type Commits interface {
	// Pending returns the up to limit oldest unpublished commits recorded
	// before recordedBefore (any time when zero), oldest first.
	Pending(ctx context.Context, recordedBefore time.Time, limit int) ([]domain.RecordedCommit, error)
	// MarkPublished marks the commits ids published, in order, and returns
	// how many of them it marked, also alongside an error.
	MarkPublished(ctx context.Context, ids []string) (int, error)
}

// Publisher sends commits' events to the message bus and waits for their
// acks. *bus.Publisher implements it; tracing.Publisher decorates it.
type Publisher interface {
	// Send sends the events of each commit and returns the wait for their
	// acks, which returns the indexes of the commits whose every event
	// was acknowledged within the given time (counted from the send),
	// also alongside an error. Rounds sent one after the other reach the
	// bus in that order whatever their waits.
	Send(ctx context.Context, commits [][]domain.Event, within time.Duration) func() ([]int, error)
	// Connected reports whether the bus can be published to now.
	Connected() bool
	// CheckStream asks the stream published to whether it answers: nil
	// when it does, an error wrapping domain.ErrUnavailable when the bus
	// does not answer (its cluster electing a leader, an outage, this
	// connection down), another error when it answers that it cannot serve
	// this publisher (no such stream).
	CheckStream(ctx context.Context) error
}

// Lease is a named claim held by one instance at a time (invariant 6),
// fenced by an epoch that every claim raises. *mongodb.Lease implements
// it.
type Lease interface {
	// TryAcquire renews the claim this instance holds or, holding none,
	// claims the lease, and reports whether this instance holds it.
	TryAcquire(ctx context.Context) (bool, error)
	// Release gives the lease up if this instance holds it, and returns
	// nil if it does not.
	Release(ctx context.Context) error
}

// shutdownGrace bounds what a shutdown waits for the markers still queued.
const shutdownGrace = 2 * time.Second

// relay publishes commits and writes their published markers: the one
// publish path of the Relay and the Sweeper.
type relay struct {
	commits Commits
	pub     Publisher
	log     *slog.Logger
	metrics *Metrics
}

func newRelay(commits Commits, pub Publisher, log *slog.Logger, m *Metrics) relay {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return relay{commits: commits, pub: pub, log: log, metrics: m}
}

// send publishes the events of commits and waits for their acks, within
// ackTimeout (see Publisher). It returns the ids of the commits whose
// every event was acknowledged, also alongside an error; the others stay
// in the outbox for the sweep. A commit that cannot be decoded is logged,
// counted as a publish error and left in the outbox, where the backlog
// metrics show it.
func (r *relay) send(ctx context.Context, commits []domain.RecordedCommit, ackTimeout time.Duration) ([]string, error) {
	return r.start(ctx, commits, ackTimeout)()
}

// start sends commits as send does and returns at once the wait for their
// acks, which returns what send returns.
func (r *relay) start(ctx context.Context, commits []domain.RecordedCommit, ackTimeout time.Duration) func() ([]string, error) {
	readable := make([]domain.RecordedCommit, 0, len(commits))
	events := make([][]domain.Event, 0, len(commits))
	for _, c := range commits {
		if c.Err != nil {
			r.log.Error("commit cannot be decoded; it stays in the outbox", "commit", c.ID, "err", c.Err)
			r.metrics.publishError()
			continue
		}
		readable = append(readable, c)
		events = append(events, c.Events)
	}
	if len(readable) == 0 {
		return func() ([]string, error) { return nil, nil }
	}
	wait := r.pub.Send(ctx, events, ackTimeout)
	return func() ([]string, error) {
		acked, err := wait()
		ids := make([]string, len(acked))
		n := 0
		for i, k := range acked {
			ids[i] = readable[k].ID
			n += len(readable[k].Events)
		}
		r.metrics.publishedEvents(n)
		if err != nil {
			r.metrics.publishError()
		}
		return ids, err
	}
}

// publish sends commits (see send) and marks the acknowledged ones
// published, within ackTimeout for the acks and as long again for the
// markers (a shutdown that starts meanwhile lets the markers go on: the
// events are in the stream, and each marker lost costs a republish). It
// returns how many commits it marked, also alongside an error.
func (r *relay) publish(ctx context.Context, commits []domain.RecordedCommit, ackTimeout time.Duration) (int, error) {
	acked, err := r.send(ctx, commits, ackTimeout)
	if len(acked) == 0 {
		return 0, err
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	marked, merr := r.commits.MarkPublished(mctx, acked)
	if merr != nil {
		err = errors.Join(err, fmt.Errorf("%d of %d acknowledged commits marked: %w", marked, len(acked), merr))
	}
	return marked, err
}
