package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// errLeaseLost: this runner's lease ran out before a renewal got through
// (its own clock fences it), or another runner claimed the task.
var errLeaseLost = errors.New("task lease lost")

// claim is one runner's hold on a task (invariant 6). A task carries an
// epoch; claiming it is one update filtered on {_id, epoch: e, lease_until
// in the past} that moves it to epoch e+1 with this owner and a new
// lease_until (the claim-by-filter pattern: the filter names the values
// the update changes, so of any number of runners exactly one matches).
//
// The owner renews lease_until every TTL/3 with a filter on its epoch, and
// every checkpoint is written with the same filter, so a runner that lost
// the task writes nothing more. A runner stops working once its last
// renewal is older than TTL minus a margin (fencing by its own clock), and
// others claim only after lease_until: with clocks that agree to well
// within the margin, two runners never work on one task at once.
type claim struct {
	jobs  *Jobs
	id    string // the task's id
	epoch int64  // this claim's epoch
	owner string
	ttl   time.Duration
	// task is the task as claimed, then as last checkpointed; only the
	// runner's goroutine touches it (the renewal uses id and epoch).
	task domain.Task

	mu        sync.Mutex
	renewedAt time.Time
}

// tryClaim claims t (as read, at its epoch) for owner. It returns nil and
// no error when another runner holds it or got it first.
func (j *Jobs) tryClaim(ctx context.Context, t domain.Task, owner string, ttl time.Duration) (*claim, error) {
	now := j.now().UTC()
	next := t.Epoch + 1
	set := bson.D{{Key: "epoch", Value: next}, {Key: "owner", Value: owner}, {Key: "state", Value: taskRunning},
		{Key: "lease_until", Value: now.Add(ttl)}}
	if t.StartedAt.IsZero() {
		t.StartedAt = now
		set = append(set, bson.E{Key: "started_at", Value: now})
	}
	update := bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}}}
	if t.Cursor != "" || t.Events > 0 {
		r := domain.Resume{At: now, Owner: owner, Cursor: t.Cursor, Events: t.Events, Streams: t.Streams}
		update = append(update, bson.E{Key: "$push", Value: bson.D{{Key: "resumes", Value: r}}})
		t.Resumes = append(t.Resumes, r)
	}
	free := bson.D{{Key: "_id", Value: t.ID}, {Key: "epoch", Value: t.Epoch}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "lease_until", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "lease_until", Value: bson.D{{Key: "$lt", Value: now}}}},
	}}}
	res, err := j.tasks.UpdateOne(ctx, free, update)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", t.ID, mongodb.Translate(err))
	}
	if res.MatchedCount == 0 {
		return nil, nil
	}
	t.Epoch, t.Owner, t.State = next, owner, taskRunning
	t.Attempts++
	return &claim{jobs: j, id: t.ID, epoch: next, task: t, owner: owner, ttl: ttl, renewedAt: now}, nil
}

// valid reports whether the claim may still act: its last renewal is
// recent enough that no other runner can have claimed the task.
func (c *claim) valid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.renewedAt) < c.ttl*3/4
}

// renew extends the lease. It returns errLeaseLost when the task moved on
// to a later claim. Unlike the task's other writes it is not refused when
// the claim is no longer valid: the filter on the claim's epoch decides,
// so a renewal that was slow to get through on a loaded store keeps the
// task as long as no other runner has claimed it, instead of restarting
// it from its last checkpoint.
func (c *claim) renew(ctx context.Context) error {
	now := c.jobs.now().UTC()
	if err := c.write(ctx, bson.D{{Key: "lease_until", Value: now.Add(c.ttl)}}); err != nil {
		return err
	}
	c.mu.Lock()
	c.renewedAt = now
	c.mu.Unlock()
	return nil
}

// update sets fields of the task if this claim is valid and still holds
// it.
func (c *claim) update(ctx context.Context, set bson.D) error {
	if !c.valid() {
		return errLeaseLost
	}
	return c.write(ctx, set)
}

// write sets fields of the task if its epoch is still this claim's.
func (c *claim) write(ctx context.Context, set bson.D) error {
	res, err := c.jobs.tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: c.id}, {Key: "epoch", Value: c.epoch}},
		bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("update %s: %w", c.id, mongodb.Translate(err))
	}
	if res.MatchedCount == 0 {
		return errLeaseLost
	}
	return nil
}

// checkpoint saves the task's cursor and counters.
func (c *claim) checkpoint(ctx context.Context, t *domain.Task) error {
	return c.update(ctx, bson.D{{Key: "cursor", Value: t.Cursor}, {Key: "events", Value: t.Events},
		{Key: "streams", Value: t.Streams}, {Key: "commits", Value: t.Commits}, {Key: "poison", Value: t.Poison}})
}

// finish sets the task's final state.
func (c *claim) finish(ctx context.Context, state, errMsg string) error {
	set := bson.D{{Key: "state", Value: state}, {Key: "finished_at", Value: c.jobs.now().UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	return c.update(ctx, set)
}

// release gives the task back for any runner to claim at once, keeping its
// cursor (a graceful stop, or an error to retry).
func (c *claim) release(ctx context.Context, errMsg string) error {
	set := bson.D{{Key: "lease_until", Value: time.Unix(0, 0).UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	return c.update(ctx, set)
}
