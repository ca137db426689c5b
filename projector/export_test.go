package projector

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// SlowWrites makes each write round of r last hold longer, and returns
// what they did so far: the rounds, and the events applied. Call it
// before r runs.
func SlowWrites(r *Runner, hold time.Duration) (counts func() (rounds []Round, events int)) {
	slow := &slowApplier{Projection: r.store, hold: hold}
	r.store = slow
	return slow.counts
}

// SpaceWrites sets the least time between the starts of r's write rounds,
// as NewSequencedRunner does.
func SpaceWrites(r *Runner, d time.Duration) { r.spacing = d }

// Round is one write round a SlowWrites Runner made: when it began to
// write, and how many rounds were in flight then, itself included.
type Round struct {
	At       time.Time
	InFlight int
}

// slowApplier records the write rounds of a Runner, each made to last a
// while so that every partition's worker has a batch waiting meanwhile.
type slowApplier struct {
	Projection
	hold time.Duration

	mu       sync.Mutex
	inFlight int
	rounds   []Round
	events   int
}

func (s *slowApplier) Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error) {
	s.mu.Lock()
	s.inFlight++
	s.rounds = append(s.rounds, Round{time.Now(), s.inFlight})
	s.mu.Unlock()
	time.Sleep(s.hold)
	out, failed, err := s.Projection.Apply(ctx, events, fresh)
	s.mu.Lock()
	s.inFlight--
	if err == nil {
		s.events += len(events)
	}
	s.mu.Unlock()
	return out, failed, err
}

func (s *slowApplier) counts() (rounds []Round, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rounds), s.events
}

// PinGroup is the priority group every process pulls a partition in.
const PinGroup = pinGroup

// Partitions is the number of partitions.
func (r *Runner) Partitions() int { return r.cfg.Partitions }

// FilterSubject is the subject filter of partition p.
func (r *Runner) FilterSubject(p int) string { return r.filterSubject(p) }

// Consumer returns the durable consumer of partition p, creating or
// updating it when it is missing or its settings differ.
func (r *Runner) Consumer(ctx context.Context, p int) (jetstream.Consumer, error) {
	return r.consumer(ctx, p)
}

// Key names the projection's version (projection.Definition.Key).
func (r *Runner) Key() string { return r.key }
