package mongodb

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
)

// Collections of the job store.
const (
	JobsCollection  = "projection_jobs"  // one document per job (jobDoc)
	LocksCollection = "projection_locks" // one rebuild lock per projection: {_id: "rebuild:<projection>", job_id, since}
)

// Jobs is the job store: the operator's jobs, their tasks and the tasks'
// leases, and the rebuild locks. Every write is w:majority, j:true,
// whatever the client's defaults.
type Jobs struct {
	jobs, tasks, locks *mongo.Collection
	leases             *Leases // of the tasks
}

// NewJobs returns the job store of db.
func NewJobs(db *mongo.Database) *Jobs {
	return &Jobs{jobs: db.Collection(JobsCollection, durably), tasks: db.Collection(TasksCollection, durably),
		locks: db.Collection(LocksCollection, durably), leases: newLeases(db, TasksCollection, "lease_until")}
}

// InsertJob stores a new job.
func (s *Jobs) InsertJob(ctx context.Context, job jobs.Job) error {
	if _, err := s.jobs.InsertOne(ctx, newJobDoc(job)); err != nil {
		return fmt.Errorf("%s job %s: %w", job.Kind, job.ID, Translate(err))
	}
	return nil
}

// InsertTasks stores tasks, keeping any that exists already (so a plan
// resumed after a crash creates the same tasks): one insert per task, as
// the embedded store stops an unordered insert at its first error, and a
// job has a few dozen tasks at most.
func (s *Jobs) InsertTasks(ctx context.Context, tasks []jobs.Task) error {
	for _, t := range tasks {
		if _, err := s.tasks.InsertOne(ctx, taskDoc(t)); err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("task %s: %w", t.ID, Translate(err))
		}
	}
	return nil
}

// Job returns the job id as stored, without its tasks. Errors:
// domain.ErrNotFound for an unknown id.
func (s *Jobs) Job(ctx context.Context, id string) (jobs.Job, error) {
	job, found, err := findOne[jobDoc](ctx, s.jobs, bson.D{{Key: "_id", Value: id}})
	if err == nil && !found {
		err = domain.ErrNotFound
	}
	if err != nil {
		return jobs.Job{}, fmt.Errorf("job %s: %w", id, err)
	}
	return job.job(), nil
}

// Tasks returns the tasks of job, by id.
func (s *Jobs) Tasks(ctx context.Context, job string) ([]jobs.Task, error) {
	return s.findTasks(ctx, "tasks of "+job, bson.D{{Key: "job", Value: job}})
}

// OpenTasks returns the tasks of every job that are in one of states, by
// id.
func (s *Jobs) OpenTasks(ctx context.Context, states ...string) ([]jobs.Task, error) {
	return s.findTasks(ctx, "list tasks", bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: states}}}})
}

// findTasks returns the tasks filter selects, by id; what names the read
// in errors.
func (s *Jobs) findTasks(ctx context.Context, what string, filter bson.D) ([]jobs.Task, error) {
	docs, err := findAll[taskDoc](ctx, s.tasks, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	tasks := make([]jobs.Task, len(docs))
	for i, d := range docs {
		tasks[i] = jobs.Task(d)
	}
	return tasks, nil
}

// SetTasksState moves the tasks of job that are in state from to state
// to (a rebuild's pending partitions, canceled).
func (s *Jobs) SetTasksState(ctx context.Context, job, from, to string) error {
	if _, err := s.tasks.UpdateMany(ctx, bson.D{{Key: "job", Value: job}, {Key: "state", Value: from}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: to}}}}); err != nil {
		return fmt.Errorf("%s tasks of %s to %s: %w", from, job, to, Translate(err))
	}
	return nil
}

// RequestCancel records an operator's request that job id stop, unless
// the job has recorded the collection its switch replaces (see
// CommitSwitch): of the two, racing, exactly one wins. It reports whether
// the request was recorded.
func (s *Jobs) RequestCancel(ctx context.Context, id string) (bool, error) {
	return s.setJob(ctx, "cancel", id, bson.D{{Key: "replaced", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "cancel_requested", Value: true}})
}

// CommitSwitch records what rebuild id's switch replaces, and its verify
// report, unless an operator asked it to stop (see RequestCancel). It
// reports whether it recorded them.
func (s *Jobs) CommitSwitch(ctx context.Context, id, replaced string, report *projection.VerifyReport) (bool, error) {
	return s.setJob(ctx, "rebuild", id, bson.D{{Key: "cancel_requested", Value: bson.D{{Key: "$ne", Value: true}}}},
		bson.D{{Key: "replaced", Value: replaced}, {Key: "report", Value: report}})
}

// setJob sets the fields set of job id's document if it also matches
// cond, and reports whether it did; what names the write in errors.
func (s *Jobs) setJob(ctx context.Context, what, id string, cond, set bson.D) (bool, error) {
	res, err := s.jobs.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, cond...), bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", what, id, Translate(err))
	}
	return res.MatchedCount == 1, nil
}

// SavePlan records a rebuild's cut of the log: its bounds, the commits
// counted and its number of partitions.
func (s *Jobs) SavePlan(ctx context.Context, job jobs.Job) error {
	bounds := job.Bounds
	if bounds == nil {
		bounds = []string{}
	}
	_, err := s.setJob(ctx, "plan", job.ID, nil,
		bson.D{{Key: "bounds", Value: bounds}, {Key: "total_commits", Value: job.TotalCommits}, {Key: "partitions", Value: job.Partitions}})
	return err
}

// Latest returns the most recent job of a kind for a projection, or nil.
func (s *Jobs) Latest(ctx context.Context, projection string, kind jobs.JobKind) (*jobs.Job, error) {
	job, found, err := findOne[jobDoc](ctx, s.jobs, bson.D{{Key: "projection", Value: projection}, {Key: "kind", Value: kind}},
		options.FindOne().SetSort(bson.D{{Key: "created_at", Value: -1}}))
	if err != nil {
		return nil, fmt.Errorf("latest %s of %s: %w", kind, projection, err)
	}
	if !found {
		return nil, nil
	}
	j := job.job()
	return &j, nil
}

// FinishJob writes a job's final state, its finish time and, unless
// empty, its error and report.
func (s *Jobs) FinishJob(ctx context.Context, id string, state jobs.JobState, errMsg string, report *projection.VerifyReport) error {
	set := bson.D{{Key: "state", Value: state}, {Key: "finished_at", Value: time.Now().UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	if report != nil {
		set = append(set, bson.E{Key: "report", Value: report})
	}
	_, err := s.setJob(ctx, "finish job", id, nil, set)
	return err
}

// lockDoc is a projection's rebuild lock: the job holding it, since when.
type lockDoc struct {
	ID    string    `bson:"_id"`
	Job   string    `bson:"job_id"`
	Since time.Time `bson:"since"`
}

// Lock takes projection's rebuild lock for job: an insert, so exactly one
// of concurrent requests gets it. A lock whose job has finished, or whose
// job was never created a minute after the lock was taken (its creator
// died), is taken over. Errors: domain.ErrJobRunning when another rebuild
// holds it.
func (s *Jobs) Lock(ctx context.Context, projection, job string) error {
	key := "rebuild:" + projection
	for attempt := 0; attempt < 3; attempt++ {
		_, err := s.locks.InsertOne(ctx, lockDoc{ID: key, Job: job, Since: time.Now().UTC()})
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("rebuild lock of %s: %w", projection, Translate(err))
		}
		l, found, err := findOne[lockDoc](ctx, s.locks, bson.D{{Key: "_id", Value: key}})
		if err != nil {
			return fmt.Errorf("rebuild lock of %s: %w", projection, err)
		}
		if !found {
			continue
		}
		held, found, err := findOne[jobDoc](ctx, s.jobs, bson.D{{Key: "_id", Value: l.Job}})
		switch {
		case err != nil:
			return fmt.Errorf("rebuild lock of %s: %w", projection, err)
		case !found && time.Since(l.Since) < time.Minute:
			return fmt.Errorf("rebuild %s is being created: %w", l.Job, domain.ErrJobRunning)
		case found && !held.State.Final():
			return fmt.Errorf("rebuild %s: %w", l.Job, domain.ErrJobRunning)
		}
		if err := s.Unlock(ctx, projection, l.Job); err != nil {
			return err
		}
	}
	return fmt.Errorf("rebuild lock of %s: contended: %w", projection, domain.ErrJobRunning)
}

// Unlock releases projection's rebuild lock if job holds it.
func (s *Jobs) Unlock(ctx context.Context, projection, job string) error {
	_, err := s.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: "rebuild:" + projection}, {Key: "job_id", Value: job}})
	if err != nil {
		return fmt.Errorf("rebuild lock of %s: %w", projection, Translate(err))
	}
	return nil
}

// jobDoc is a job as stored in JobsCollection. The fields Jobs.Get fills
// in from the tasks are not stored.
type jobDoc struct {
	ID              string                   `bson:"_id"`
	Kind            jobs.JobKind             `bson:"kind"`
	Projection      string                   `bson:"projection,omitempty"`
	Version         int                      `bson:"version,omitempty"`
	State           jobs.JobState            `bson:"state"`
	CreatedAt       time.Time                `bson:"created_at"`
	FinishedAt      time.Time                `bson:"finished_at,omitempty"`
	Error           string                   `bson:"error,omitempty"`
	Partitions      int                      `bson:"partitions,omitempty"`
	Shadow          string                   `bson:"shadow,omitempty"`
	Replaced        string                   `bson:"replaced,omitempty"`
	Repair          bool                     `bson:"repair,omitempty"`
	Replay          *replayDoc               `bson:"replay,omitempty"`
	TotalCommits    int64                    `bson:"total_commits"`
	Bounds          []string                 `bson:"bounds,omitempty"`
	Report          *projection.VerifyReport `bson:"report,omitempty"`
	CancelRequested bool                     `bson:"cancel_requested,omitempty"`
}

func newJobDoc(j jobs.Job) jobDoc {
	return jobDoc{ID: j.ID, Kind: j.Kind, Projection: j.Projection, Version: j.Version, State: j.State, CreatedAt: j.CreatedAt,
		FinishedAt: j.FinishedAt, Error: j.Error, Partitions: j.Partitions, Shadow: j.Shadow, Replaced: j.Replaced,
		Repair: j.Repair, Replay: (*replayDoc)(j.Replay), TotalCommits: j.TotalCommits, Bounds: j.Bounds,
		Report: j.Report, CancelRequested: j.CancelRequested}
}

func (d jobDoc) job() jobs.Job {
	return jobs.Job{ID: d.ID, Kind: d.Kind, Projection: d.Projection, Version: d.Version, State: d.State, CreatedAt: d.CreatedAt,
		FinishedAt: d.FinishedAt, Error: d.Error, Partitions: d.Partitions, Shadow: d.Shadow, Replaced: d.Replaced,
		Repair: d.Repair, Replay: (*jobs.ReplaySpec)(d.Replay), TotalCommits: d.TotalCommits, Bounds: d.Bounds,
		Report: d.Report, CancelRequested: d.CancelRequested}
}

// replayDoc is a replay job's jobs.ReplaySpec. It has the same fields,
// so the two convert into each other and a field added to one and not the
// other does not compile.
type replayDoc struct {
	StreamID string    `bson:"stream_id,omitempty"`
	From     time.Time `bson:"from,omitempty"`
	To       time.Time `bson:"to,omitempty"`
}
