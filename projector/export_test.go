package projector

import (
	"context"
	"sync"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// SlowWrites makes each write round of r last hold longer, and returns
// what they did so far: the most rounds in flight at once, the rounds,
// and the events applied. Call it before r runs.
func SlowWrites(r *Runner, hold time.Duration) (counts func() (most, rounds, events int)) {
	slow := &slowApplier{Projection: r.store, hold: hold}
	r.store = slow
	return slow.counts
}

// slowApplier counts the write rounds of a Runner in flight at once, each
// made to last a while so that every partition's worker has a batch
// waiting meanwhile.
type slowApplier struct {
	Projection
	hold time.Duration

	mu                     sync.Mutex
	inFlight, most, rounds int
	events                 int
}

func (s *slowApplier) Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error) {
	s.mu.Lock()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.rounds++
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

func (s *slowApplier) counts() (most, rounds, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most, s.rounds, s.events
}
