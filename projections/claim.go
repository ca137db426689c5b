package projections

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/eventstore/mongoerr"
)

// errLeaseLost: this runner's lease ran out before a renewal got through
// (its own clock fences it), or another runner claimed the task.
var errLeaseLost = errors.New("task lease lost")

// claim is one runner's hold on a task (invariant 6). A task carries an
// epoch; claiming it means moving it from epoch e to e+1, in two steps:
//
//  1. insert the claim document "<task>#<e+1>" — a unique _id, so of any
//     number of runners exactly one succeeds, also on FerretDB 1.24, whose
//     updates are not atomic;
//  2. the winner updates the task with a filter on {_id, epoch: e} (the
//     claim-by-filter pattern) to epoch e+1, owner and lease_until.
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
	task Task

	mu        sync.Mutex
	renewedAt time.Time
	// writing serialises this claim's updates of the task: FerretDB 1.24
	// runs an update as a read and a later write of the whole document,
	// so a renewal overlapping a checkpoint could write back the older
	// cursor and counters.
	writing sync.Mutex
}

// tryClaim claims t (as read, at its epoch) for owner. It returns nil and
// no error when another runner got it first.
func (j *Jobs) tryClaim(ctx context.Context, t Task, owner string, ttl time.Duration) (*claim, error) {
	now := j.now().UTC()
	next := t.Epoch + 1
	for {
		_, err := j.claims.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("%s#%d", t.ID, next)},
			{Key: "owner", Value: owner}, {Key: "at", Value: now}})
		if err == nil {
			break
		}
		if !mongo.IsDuplicateKeyError(err) {
			return nil, fmt.Errorf("claim %s: %w", t.ID, mongoerr.Translate(err))
		}
		// Another runner holds this epoch's claim. If it is older than a
		// lease and the task never moved to it, its runner died between
		// the two steps: claim the epoch after it instead, or the task
		// could never be claimed again.
		var held struct {
			At time.Time `bson:"at"`
		}
		err = j.claims.FindOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("%s#%d", t.ID, next)}}).Decode(&held)
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			return nil, fmt.Errorf("claim %s: %w", t.ID, mongoerr.Translate(err))
		}
		if err == nil && now.Sub(held.At) < ttl {
			return nil, nil
		}
		next++
	}
	set := bson.D{{Key: "epoch", Value: next}, {Key: "owner", Value: owner}, {Key: "state", Value: taskRunning},
		{Key: "lease_until", Value: now.Add(ttl)}}
	if t.StartedAt.IsZero() {
		t.StartedAt = now
		set = append(set, bson.E{Key: "started_at", Value: now})
	}
	update := bson.D{{Key: "$set", Value: set}, {Key: "$inc", Value: bson.D{{Key: "attempts", Value: 1}}}}
	if t.Cursor != "" || t.Events > 0 {
		r := Resume{At: now, Owner: owner, Cursor: t.Cursor, Events: t.Events, Streams: t.Streams}
		update = append(update, bson.E{Key: "$push", Value: bson.D{{Key: "resumes", Value: r}}})
		t.Resumes = append(t.Resumes, r)
	}
	res, err := j.tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: t.ID}, {Key: "epoch", Value: t.Epoch}}, update)
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", t.ID, mongoerr.Translate(err))
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

// renew extends the lease. It returns errLeaseLost when a later claim
// exists or the task moved on.
func (c *claim) renew(ctx context.Context) error {
	lost, err := c.superseded(ctx)
	if err != nil {
		return err
	}
	if lost {
		return errLeaseLost
	}
	now := c.jobs.now().UTC()
	if err := c.update(ctx, bson.D{{Key: "lease_until", Value: now.Add(c.ttl)}}); err != nil {
		return err
	}
	c.mu.Lock()
	c.renewedAt = now
	c.mu.Unlock()
	return nil
}

// superseded reports whether a later claim of the task exists.
func (c *claim) superseded(ctx context.Context) (bool, error) {
	err := c.jobs.claims.FindOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("%s#%d", c.id, c.epoch+1)}}).Err()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim of %s: %w", c.id, mongoerr.Translate(err))
	}
	return true, nil
}

// update sets fields of the task if this claim still holds it.
func (c *claim) update(ctx context.Context, set bson.D) error {
	c.writing.Lock()
	defer c.writing.Unlock()
	if !c.valid() {
		return errLeaseLost
	}
	res, err := c.jobs.tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: c.id}, {Key: "epoch", Value: c.epoch}},
		bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("update %s: %w", c.id, mongoerr.Translate(err))
	}
	if res.MatchedCount == 0 {
		return errLeaseLost
	}
	return nil
}

// checkpoint saves the task's cursor and counters.
func (c *claim) checkpoint(ctx context.Context, t *Task) error {
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
