package mongodb

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/lease"
)

// TasksCollection holds the jobs' tasks, one document per task
// (taskDoc); a task's owner, epoch and lease_until are its lease, which
// the job store keeps (jobs.TaskLeases): a task is claimed by one runner
// at a time, at the epoch it was read at, and every write of its runner
// (renewal, checkpoint, finish, release) is fenced by the claim's epoch,
// so a runner that lost the task writes nothing more (see Leases).
const TasksCollection = "projection_job_tasks"

// Claim claims t for holder for ttl if t is still at the epoch it was read
// at and its lease was never taken or has expired, in one update: the
// task moves to state and the next epoch, counts an attempt, records its
// start if it had none, and, when it had made progress, a jobs.Resume
// of the cursor and counters the holder starts from. Its attempts and
// resumes are set from t as read: only a claim, which the epoch fences,
// changes them. It returns the task as claimed and the claim's lease, or
// false and no error when another runner holds it or got it first.
func (s *Jobs) Claim(ctx context.Context, t jobs.Task, holder string, ttl time.Duration, state string) (jobs.Task, lease.Lease, bool, error) {
	now := time.Now()
	utc := now.UTC()
	if t.StartedAt.IsZero() {
		t.StartedAt = utc
	}
	if t.Cursor != "" || t.Events > 0 {
		t.Resumes = append(t.Resumes, jobs.Resume{At: utc, Owner: holder, Cursor: t.Cursor, Events: t.Events, Streams: t.Streams})
	}
	set := bson.D{{Key: "state", Value: state}, {Key: "started_at", Value: t.StartedAt}, {Key: "attempts", Value: t.Attempts + 1}}
	if len(t.Resumes) > 0 {
		set = append(set, bson.E{Key: "resumes", Value: t.Resumes})
	}
	free := bson.D{{Key: "epoch", Value: t.Epoch}, {Key: "$or", Value: s.leases.expired(now)}}
	lease, ok, err := s.leases.claim(ctx, t.ID, holder, ttl, now, free, set, false)
	if err != nil || !ok {
		return t, lease, false, err
	}
	t.Epoch, t.Owner, t.State, t.LeaseUntil = lease.Epoch, holder, state, lease.ExpiresAt
	t.Attempts++
	return t, lease, true, nil
}

// Renew extends the claim's lease by ttl (see Leases.Renew). Errors:
// domain.ErrLeaseLost when another runner has claimed the task since.
func (s *Jobs) Renew(ctx context.Context, lease lease.Lease, ttl time.Duration) (lease.Lease, error) {
	return s.leases.Renew(ctx, lease, ttl)
}

// Checkpoint saves t's cursor and counters under lease. Errors:
// domain.ErrLeaseLost when the task has passed to another claim.
func (s *Jobs) Checkpoint(ctx context.Context, lease lease.Lease, t jobs.Task) error {
	return s.leases.write(ctx, lease, bson.D{{Key: "cursor", Value: t.Cursor}, {Key: "events", Value: t.Events},
		{Key: "streams", Value: t.Streams}, {Key: "commits", Value: t.Commits}, {Key: "poison", Value: t.Poison}, {Key: "summed", Value: t.Summed}}, "checkpoint task")
}

// Finish sets the task's final state, its finish time and, unless empty,
// its error, under lease. Errors: domain.ErrLeaseLost when the task has
// passed to another claim.
func (s *Jobs) Finish(ctx context.Context, lease lease.Lease, state, errMsg string) error {
	set := bson.D{{Key: "state", Value: state}, {Key: "finished_at", Value: time.Now().UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	return s.leases.write(ctx, lease, set, "finish task")
}

// Release gives the task back for any runner to claim at once, keeping
// its cursor, with errMsg as its error unless empty. Errors:
// domain.ErrLeaseLost when the task has passed to another claim.
func (s *Jobs) Release(ctx context.Context, lease lease.Lease, errMsg string) error {
	set := bson.D{{Key: "lease_until", Value: time.Unix(0, 0).UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	return s.leases.write(ctx, lease, set, "release task")
}

// taskDoc is a task as stored in TasksCollection. It has jobs.Task's
// fields, so the two convert into each other and a field added to one and
// not the other does not compile; its resumes are stored under
// jobs.Resume's JSON names (jsonNames).
type taskDoc struct {
	ID         string        `bson:"_id"`
	Job        string        `bson:"job"`
	Name       string        `bson:"name"`
	From       string        `bson:"from,omitempty"`
	To         string        `bson:"to,omitempty"`
	State      string        `bson:"state"`
	Owner      string        `bson:"owner,omitempty"`
	Epoch      int64         `bson:"epoch"`
	LeaseUntil time.Time     `bson:"lease_until,omitempty"`
	Attempts   int           `bson:"attempts"`
	Cursor     string        `bson:"cursor,omitempty"`
	Events     int64         `bson:"events"`
	Streams    int64         `bson:"streams"`
	Commits    int64         `bson:"commits"`
	Poison     int64         `bson:"poison"`
	Summed     int64         `bson:"summed"`
	Resumes    []jobs.Resume `bson:"resumes,omitempty"`
	StartedAt  time.Time     `bson:"started_at,omitempty"`
	FinishedAt time.Time     `bson:"finished_at,omitempty"`
	Error      string        `bson:"error,omitempty"`
}
