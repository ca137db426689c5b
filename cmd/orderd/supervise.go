package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/pause"
)

// supervise runs a role until ctx is done, restarting it with capped
// exponential backoff when it fails (a consumer that could not be created
// while JetStream was electing a leader, say), so one failing role never
// stops the others. A role that returns while ctx lasts is restarted
// too, so this is a loop and not backoff.Retry, which stops at the first
// nil. role is relay, projector or jobs; a projector runs one run per
// projection, named by projection. Repeated stops make the role failing
// (roleHealth): /readyz and orderd_role_failing say so.
func (m *Main) supervise(ctx context.Context, role, projection string, run func(context.Context) error) error {
	u := m.health.unit(role, projection)
	delays := restartDelays()
	for ctx.Err() == nil {
		healthy := time.AfterFunc(healthyRun, u.ran)
		err := run(ctx)
		healthy.Stop()
		if ctx.Err() != nil {
			break
		}
		wait := delays.NextBackOff()
		m.Log.Error("role stopped; restarting", "role", u.name, "err", err, "retry_in", wait)
		if n, failing := u.stopped(err); failing {
			m.Log.Error("role failing: it stopped repeatedly without running healthily in between; /readyz answers 503",
				"role", u.name, "stops_in_a_row", n)
		}
		pause.For(ctx, wait)
	}
	return nil
}

// restartDelays are supervise's waits: 100 ms doubling up to 10 s, without
// jitter (one restart per role and process: nothing to spread) and
// without a limit on the time spent retrying.
func restartDelays() backoff.BackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMultiplier(2),
		backoff.WithMaxInterval(10*time.Second),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxElapsedTime(0),
	)
}

// The rule of a failing role: a supervised run (the relay, the jobs
// worker, one projection's runner) is failing once it has stopped
// failingAfter times in a row, none of those runs having lasted
// healthyRun; it is healthy again once a run has lasted healthyRun. With
// the restart delays, a run that fails at once is failing about 1.5 s
// after its first stop, so a leader election of a second or so does not
// count; healthyRun outlasts the longest restart delay, so a run that
// lasted it got past what stopped it.
const (
	failingAfter = 5
	healthyRun   = 10 * time.Second
)

// roleHealth follows the supervised runs of a process by the rule above.
// Its readiness check of a role (check) fails while one of its runs is
// failing; orderd_role_failing is 1 for it.
type roleHealth struct {
	mu      sync.Mutex
	units   []*unitHealth
	failing *prometheus.GaugeVec
	stops   *prometheus.CounterVec
}

// unitHealth is one supervised run's stops.
type unitHealth struct {
	h                *roleHealth
	role, projection string
	name             string // the role, or "projection <projection>" for a projector's run
	inRow            int    // stops in a row, each run shorter than healthyRun
	last             error  // the last stop's error
}

func newRoleHealth(reg prometheus.Registerer) *roleHealth {
	h := &roleHealth{
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_role_failing",
			Help: "1 while a role of this instance (the projector's runner of a projection) is failing: it stopped 5 times in a row, no run lasting 10 s; /readyz then answers 503 naming the role."},
			[]string{"role", "projection"}),
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderd_role_restarts_total",
			Help: "Times a role of this instance (the projector's runner of a projection) stopped with an error and was restarted."},
			[]string{"role", "projection"}),
	}
	reg.MustRegister(h.failing, h.stops)
	return h
}

// unit returns the health of a supervised run.
func (h *roleHealth) unit(role, projection string) *unitHealth {
	u := &unitHealth{h: h, role: role, projection: projection, name: role}
	if projection != "" {
		u.name = "projection " + projection
	}
	h.mu.Lock()
	h.units = append(h.units, u)
	h.mu.Unlock()
	h.failing.WithLabelValues(role, projection).Set(0)
	h.stops.WithLabelValues(role, projection).Add(0)
	return u
}

// ran records a run that has lasted healthyRun.
func (u *unitHealth) ran() {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	u.inRow, u.last = 0, nil
	u.h.failing.WithLabelValues(u.role, u.projection).Set(0)
}

// stopped records a stop with err; failing reports whether the run is
// failing, n how many times in a row it stopped.
func (u *unitHealth) stopped(err error) (n int, failing bool) {
	u.h.mu.Lock()
	defer u.h.mu.Unlock()
	u.inRow++
	u.last = err
	u.h.stops.WithLabelValues(u.role, u.projection).Inc()
	if u.inRow >= failingAfter {
		u.h.failing.WithLabelValues(u.role, u.projection).Set(1)
	}
	return u.inRow, u.inRow >= failingAfter
}

// check is the readiness check of role: an error naming each of its
// failing runs.
func (h *roleHealth) check(role string) orderhttp.Check {
	return func(context.Context) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		var errs []error
		for _, u := range h.units {
			if u.role != role || u.inRow < failingAfter {
				continue
			}
			errs = append(errs, fmt.Errorf("%s stopped %d times in a row: %w", u.name, u.inRow, u.last))
		}
		return errors.Join(errs...)
	}
}
