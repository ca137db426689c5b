package jobs

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/lease"
)

// TaskLeases holds the tasks' leases (invariant 6): a task is claimed at
// the epoch it was read at, and each of its runner's writes is fenced by
// the claim's epoch. The MongoDB adapter's *mongodb.Jobs implements it.
// Every method fails with domain.ErrUnavailable when the store cannot be
// reached, and those taking a lease with domain.ErrLeaseLost when it has
// passed to another claim.
type TaskLeases interface {
	// Claim claims t, as read, for holder for ttl and moves it to state;
	// false and no error when another runner holds it or got it first.
	Claim(ctx context.Context, t Task, holder string, ttl time.Duration, state string) (Task, lease.Lease, bool, error)
	// Renew extends the claim's lease by ttl.
	Renew(ctx context.Context, lease lease.Lease, ttl time.Duration) (lease.Lease, error)
	// Checkpoint saves t's cursor and counters.
	Checkpoint(ctx context.Context, lease lease.Lease, t Task) error
	// Finish sets the task's final state and error.
	Finish(ctx context.Context, lease lease.Lease, state, errMsg string) error
	// Release gives the task back for any runner to claim at once.
	Release(ctx context.Context, lease lease.Lease, errMsg string) error
}

// claim is one runner's hold on a task (invariant 6). A task carries an
// epoch; claiming it is one update filtered on {_id, epoch: e, lease_until
// in the past} that moves it to epoch e+1 with this owner and a new
// lease_until (the claim-by-filter pattern: the filter names the values
// the update changes, so of any number of runners exactly one matches).
//
// The owner renews lease_until every TTL/3 with a filter on its epoch, and
// every checkpoint is written with the same filter, so a runner that lost
// the task writes nothing more (domain.ErrLeaseLost). A runner stops
// working once its last renewal is older than TTL minus a margin (fencing
// by its own clock), and others claim only after lease_until: with clocks
// that agree to well within the margin, two runners never work on one task
// at once.
type claim struct {
	leases TaskLeases
	ttl    time.Duration
	// task is the task as claimed, then as last checkpointed; only the
	// runner's goroutine touches it (the renewal uses the lease).
	task  Task
	lease atomic.Pointer[lease.Lease] // as last renewed
}

// tryClaim claims t (as read, at its epoch) for owner. It returns nil and
// no error when another runner holds it or got it first.
func (j *Jobs) tryClaim(ctx context.Context, t Task, owner string, ttl time.Duration) (*claim, error) {
	claimed, lease, ok, err := j.store.Claim(ctx, t, owner, ttl, taskRunning)
	if err != nil || !ok {
		return nil, err
	}
	c := &claim{leases: j.store, ttl: ttl, task: claimed}
	c.lease.Store(&lease)
	return c, nil
}

// valid reports whether the claim may still act: its last renewal is
// recent enough that no other runner can have claimed the task.
func (c *claim) valid() bool {
	return time.Since(c.held().RenewedAt) < c.ttl*3/4
}

// held returns the claim's lease as last renewed.
func (c *claim) held() lease.Lease { return *c.lease.Load() }

// renew extends the lease. It returns domain.ErrLeaseLost when the task moved on
// to a later claim. Unlike the task's other writes it is not refused when
// the claim is no longer valid: the filter on the claim's epoch decides,
// so a renewal that was slow to get through on a loaded store keeps the
// task as long as no other runner has claimed it, instead of restarting
// it from its last checkpoint.
func (c *claim) renew(ctx context.Context) error {
	renewed, err := c.leases.Renew(ctx, c.held(), c.ttl)
	if err != nil {
		return err
	}
	c.lease.Store(&renewed)
	return nil
}

// checkpoint saves the task's cursor and counters.
func (c *claim) checkpoint(ctx context.Context, t *Task) error {
	if !c.valid() {
		return domain.ErrLeaseLost
	}
	return c.leases.Checkpoint(ctx, c.held(), *t)
}

// finish sets the task's final state.
func (c *claim) finish(ctx context.Context, state, errMsg string) error {
	if !c.valid() {
		return domain.ErrLeaseLost
	}
	return c.leases.Finish(ctx, c.held(), state, errMsg)
}

// release gives the task back for any runner to claim at once, keeping its
// cursor (a graceful stop, or an error to retry).
func (c *claim) release(ctx context.Context, errMsg string) error {
	if !c.valid() {
		return domain.ErrLeaseLost
	}
	return c.leases.Release(ctx, c.held(), errMsg)
}
