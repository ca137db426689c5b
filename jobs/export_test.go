package jobs

import (
	"context"
	"fmt"
	"time"
)

// Claim is a runner's hold on a task, for the tests of claims.
type Claim struct{ c *claim }

// ClaimOnlyTask claims the one task of job for owner for ttl; nil when
// another runner holds it.
func (j *Jobs) ClaimOnlyTask(ctx context.Context, job, owner string, ttl time.Duration) (*Claim, error) {
	tasks, err := j.store.Tasks(ctx, job)
	if err != nil {
		return nil, err
	}
	if len(tasks) != 1 {
		return nil, fmt.Errorf("job %s has %d tasks, want 1", job, len(tasks))
	}
	c, err := j.tryClaim(ctx, tasks[0], owner, ttl)
	if c == nil || err != nil {
		return nil, err
	}
	return &Claim{c}, nil
}

// TaskID is the claimed task's id.
func (c *Claim) TaskID() string { return c.c.task.ID }

// Lapse makes the claim's last renewal a whole ttl old.
func (c *Claim) Lapse(ttl time.Duration) {
	l := c.c.held()
	l.RenewedAt = time.Now().Add(-ttl)
	c.c.lease.Store(&l)
}

// Valid reports whether the claim may act.
func (c *Claim) Valid() bool { return c.c.valid() }

// Renew renews the claim's lease.
func (c *Claim) Renew(ctx context.Context) error { return c.c.renew(ctx) }

// Checkpoint saves the task as claimed.
func (c *Claim) Checkpoint(ctx context.Context) error { return c.c.checkpoint(ctx, &c.c.task) }

// PercentOr returns Percent, or unknown when it is nil.
func (p JobPhase) PercentOr(unknown int) int {
	if p.Percent == nil {
		return unknown
	}
	return *p.Percent
}
