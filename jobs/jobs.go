package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// Collections of the jobs.
const (
	Collection      = "projection_jobs"       // one document per job
	TasksCollection = mongodb.TasksCollection // the claimable units of a job
	LocksCollection = "projection_locks"      // one rebuild per projection
)

// Task states.
const (
	taskPending  = "pending"
	taskRunning  = "running"
	taskDone     = "done"
	taskFailed   = "failed"
	taskCanceled = "canceled"
)

// Task names.
const (
	taskPlan   = "plan"
	taskFinish = "finish"
	taskVerify = "verify"
	taskReplay = "replay"
)

// EventLog is the event log as the jobs read it: a stream's events, a scan in
// log order, the number of commits, and the stream ids that cut the log
// into n ranges of about equal commits (a rebuild's partitions).
// eventstore.Store implements it.
type EventLog interface {
	Load(ctx context.Context, streamID string, after int64) ([]domain.Event, error)
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
	Commits(ctx context.Context) (int64, error)
	Bounds(ctx context.Context, n int) (bounds []string, commits int64, err error)
}

// Jobs stores jobs and their tasks, and creates, reads and cancels them.
type Jobs struct {
	db       *mongo.Database
	jobs     *mongo.Collection
	tasks    *mongo.Collection
	leases   TaskLeases
	locks    *mongo.Collection
	pointers *projection.Pointers
	events   EventLog
	defs     map[string]string // projection name -> base collection
	now      func() time.Time
}

// New returns the jobs of db for the projections named in defs
// (projection name to its projection.Definition's Collection), whose
// pointer documents ps keeps, reading log.
func New(db *mongo.Database, ps *projection.Pointers, events EventLog, defs map[string]string) *Jobs {
	return &Jobs{db: db, jobs: db.Collection(Collection), tasks: db.Collection(TasksCollection),
		leases: mongodb.NewTasks(db), locks: db.Collection(LocksCollection),
		pointers: ps, events: events, defs: defs, now: time.Now}
}

// Projections returns the names of the projections, sorted.
func (j *Jobs) Projections() []string {
	var out []string
	for n := range j.defs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (j *Jobs) known(projection string) error {
	if _, ok := j.defs[projection]; !ok {
		return fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	return nil
}

func newJobID() string { return uuid.Must(uuid.NewV7()).String() }

func (j *Jobs) create(ctx context.Context, job domain.Job, task string) error {
	if _, err := j.tasks.InsertOne(ctx, domain.Task{ID: job.ID + "/" + task, Job: job.ID, Name: task, State: taskPending}); err != nil {
		return fmt.Errorf("%s job: %w", job.Kind, mongodb.Translate(err))
	}
	if _, err := j.jobs.InsertOne(ctx, job); err != nil {
		return fmt.Errorf("%s job: %w", job.Kind, mongodb.Translate(err))
	}
	return nil
}

// Get returns a job with its tasks and progress. Errors:
// domain.ErrNotFound for an unknown id.
func (j *Jobs) Get(ctx context.Context, id string) (domain.Job, error) {
	var job domain.Job
	err := j.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&job)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return domain.Job{}, fmt.Errorf("job %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return domain.Job{}, fmt.Errorf("job %s: %w", id, mongodb.Translate(err))
	}
	tasks, err := j.jobTasks(ctx, id)
	if err != nil {
		return domain.Job{}, err
	}
	job.Tasks = tasks
	var commits int64
	for _, t := range tasks {
		if t.State == taskRunning && !job.State.Final() {
			job.State = domain.StateRunning
		}
		if !t.StartedAt.IsZero() && (job.StartedAt.IsZero() || t.StartedAt.Before(job.StartedAt)) {
			job.StartedAt = t.StartedAt
		}
		if t.Name == taskFinish || t.Name == taskPlan {
			continue
		}
		job.Events += t.Events
		job.Streams += t.Streams
		job.PoisonStreams += t.Poison
		commits += t.Commits
	}
	if !job.StartedAt.IsZero() {
		end := job.FinishedAt
		if end.IsZero() {
			end = j.now()
		}
		if secs := end.Sub(job.StartedAt).Seconds(); secs > 0 {
			job.RatePerSecond = float64(job.Events) / secs
			if !job.State.Final() && commits > 0 && job.TotalCommits > commits {
				job.ETASeconds = float64(job.TotalCommits-commits) / (float64(commits) / secs)
			}
		}
	}
	return job, nil
}

func (j *Jobs) jobTasks(ctx context.Context, job string) ([]domain.Task, error) {
	cur, err := j.tasks.Find(ctx, bson.D{{Key: "job", Value: job}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("tasks of %s: %w", job, mongodb.Translate(err))
	}
	tasks := []domain.Task{}
	if err := cur.All(ctx, &tasks); err != nil {
		return nil, fmt.Errorf("tasks of %s: %w", job, mongodb.Translate(err))
	}
	// Partitions in order, the finish last.
	rank := func(t domain.Task) int {
		switch t.Name {
		case taskPlan:
			return -1
		case taskFinish:
			return math.MaxInt
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(t.Name, "part-"))
		return n
	}
	slices.SortFunc(tasks, func(a, b domain.Task) int { return cmp.Compare(rank(a), rank(b)) })
	return tasks, nil
}

// Cancel asks a job to stop. Its runners stop at their next checkpoint; a
// canceled rebuild leaves the active collection as it was and drops its
// shadow. A rebuild whose finish has verified its shadow and recorded the
// collection it replaces (domain.Job.Replaced) is committed to the switch: a
// cancel is too late and refused as finished, and the job ends succeeded.
// The request and that commit are each one update filtered on the other's
// field, so when they race exactly one of them wins. Errors:
// domain.ErrNotFound, domain.ErrJobFinished (a final job, or a rebuild committed
// to its switch).
func (j *Jobs) Cancel(ctx context.Context, id string) (domain.Job, error) {
	job, err := j.Get(ctx, id)
	if err != nil {
		return domain.Job{}, err
	}
	if job.State.Final() {
		return job, fmt.Errorf("job %s is %s: %w", id, job.State, domain.ErrJobFinished)
	}
	if job.Replaced != "" {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, domain.ErrJobFinished)
	}
	res, err := j.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "replaced", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "cancel_requested", Value: true}}}})
	if err != nil {
		return domain.Job{}, fmt.Errorf("cancel %s: %w", id, mongodb.Translate(err))
	}
	if res.MatchedCount == 0 {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, domain.ErrJobFinished)
	}
	job.CancelRequested = true
	return job, nil
}

// cancelRequested reports whether an operator asked job id to stop.
func (j *Jobs) cancelRequested(ctx context.Context, id string) (bool, error) {
	var job struct {
		CancelRequested bool `bson:"cancel_requested"`
	}
	err := j.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: id}}, options.FindOne().SetProjection(bson.D{{Key: "cancel_requested", Value: 1}})).Decode(&job)
	if err != nil {
		return false, fmt.Errorf("cancel request of %s: %w", id, mongodb.Translate(err))
	}
	return job.CancelRequested, nil
}

// Latest returns the most recent job of a kind for a projection, or nil.
func (j *Jobs) Latest(ctx context.Context, projection string, kind domain.JobKind) (*domain.Job, error) {
	var job domain.Job
	err := j.jobs.FindOne(ctx, bson.D{{Key: "projection", Value: projection}, {Key: "kind", Value: kind}},
		options.FindOne().SetSort(bson.D{{Key: "created_at", Value: -1}})).Decode(&job)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest %s of %s: %w", kind, projection, mongodb.Translate(err))
	}
	return &job, nil
}

// finishJob writes a job's final state.
func (j *Jobs) finishJob(ctx context.Context, id string, state domain.JobState, errMsg string, report *domain.VerifyReport) error {
	set := bson.D{{Key: "state", Value: state}, {Key: "finished_at", Value: j.now().UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	if report != nil {
		set = append(set, bson.E{Key: "report", Value: report})
	}
	if _, err := j.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: set}}); err != nil {
		return fmt.Errorf("finish job %s: %w", id, mongodb.Translate(err))
	}
	return nil
}

// DeadLetterCounter counts a projection's dead letters. The MongoDB
// adapter's *mongodb.DeadLetters implements it.
type DeadLetterCounter interface {
	Count(ctx context.Context, projection string) (int64, error)
}

var _ DeadLetterCounter = (*mongodb.DeadLetters)(nil)

// Status returns each projection's pointer, latest verify and rebuild,
// and dead letters; lag (nil when unknown) and last error come from the
// callers that know them (the projection runners).
func (j *Jobs) Status(ctx context.Context, dead DeadLetterCounter, lag func(ctx context.Context, name string) (*uint64, string)) ([]domain.ProjectionStatus, error) {
	var out []domain.ProjectionStatus
	for _, name := range j.Projections() {
		ptr, err := j.pointers.Get(ctx, name, j.defs[name], 0)
		if err != nil {
			return nil, err
		}
		st := domain.ProjectionStatus{Name: name, ActiveCollection: ptr.Active, ShadowCollection: ptr.Shadow, Generation: ptr.Generation}
		if lag != nil {
			st.ConsumerLag, st.LastError = lag(ctx, name)
		}
		if dead != nil {
			if st.DeadLetters, err = dead.Count(ctx, name); err != nil {
				return nil, err
			}
		}
		v, err := j.Latest(ctx, name, domain.KindVerify)
		if err != nil {
			return nil, err
		}
		if v != nil {
			vs := &domain.VerifySummary{Job: v.ID, State: v.State, FinishedAt: v.FinishedAt}
			if v.Report != nil {
				vs.Drift, vs.Repaired, vs.Digest = v.Report.Drift(), v.Report.Repaired, v.Report.Digest
			}
			st.LastVerify = vs
		}
		r, err := j.Latest(ctx, name, domain.KindRebuild)
		if err != nil {
			return nil, err
		}
		if r != nil {
			st.LastRebuild = &domain.JobSummary{Job: r.ID, State: r.State, Error: r.Error}
			if r.Error != "" && st.LastError == "" {
				st.LastError = "rebuild: " + r.Error
			}
		}
		out = append(out, st)
	}
	return out, nil
}
