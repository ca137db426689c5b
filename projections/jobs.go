package projections

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
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// Collections of the repair jobs.
const (
	JobsCollection  = "projection_jobs"      // one document per job
	TasksCollection = "projection_job_tasks" // the claimable units of a job
	LocksCollection = "projection_locks"     // one rebuild per projection
)

// The job types are the domain's (domain/ops.go).
type (
	JobKind          = domain.JobKind
	JobState         = domain.JobState
	ReplaySpec       = domain.ReplaySpec
	Job              = domain.Job
	Task             = domain.Task
	Resume           = domain.Resume
	VerifyReport     = domain.VerifyReport
	DriftExample     = domain.DriftExample
	ProjectionStatus = domain.ProjectionStatus
	VerifySummary    = domain.VerifySummary
	JobSummary       = domain.JobSummary
	DeadLetter       = domain.DeadLetter
)

// Job kinds and states (domain/ops.go).
const (
	KindRebuild    = domain.KindRebuild
	KindVerify     = domain.KindVerify
	KindReplay     = domain.KindReplay
	StateQueued    = domain.StateQueued
	StateRunning   = domain.StateRunning
	StateSucceeded = domain.StateSucceeded
	StateFailed    = domain.StateFailed
	StateCanceled  = domain.StateCanceled
)

// Errors of job and dead-letter requests (domain/ops.go).
var (
	ErrJobRunning   = domain.ErrJobRunning
	ErrJobFinished  = domain.ErrJobFinished
	ErrRetryFailed  = domain.ErrRetryFailed
	ErrPointerMoved = domain.ErrPointerMoved
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

// Log is the event log as the repair jobs read it; eventstore.Store
// implements it.
type Log interface {
	EventLog
	Load(ctx context.Context, streamID string, after int64) ([]domain.Event, error)
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
	Commits(ctx context.Context) (int64, error)
	Bounds(ctx context.Context, n int, total int64) ([]string, error)
}

// Jobs stores jobs and their tasks, and creates and cancels them.
type Jobs struct {
	db       *mongo.Database
	jobs     *mongo.Collection
	tasks    *mongo.Collection
	locks    *mongo.Collection
	pointers *Pointers
	log      Log
	defs     map[string]string // projection name -> base collection
	now      func() time.Time
}

// NewJobs returns the jobs of db for the projections named in defs
// (projection name to its Definition's Collection).
func NewJobs(db *mongo.Database, ps *Pointers, log Log, defs map[string]string) *Jobs {
	return &Jobs{db: db, jobs: db.Collection(JobsCollection), tasks: db.Collection(TasksCollection),
		locks:    db.Collection(LocksCollection),
		pointers: ps, log: log, defs: defs, now: time.Now}
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

// MaxPartitions bounds the partitions of one rebuild.
const MaxPartitions = domain.MaxPartitions

// StartRebuild creates a rebuild job of projection split into partitions
// (1 to MaxPartitions) and announces its shadow collection, which live
// projectors then also write. Errors: domain.ErrNotFound for an unknown
// projection, domain.ErrValidation for a bad partition count, ErrJobRunning
// (wrapped, with the running job's id) while another rebuild of the
// projection is not finished.
func (j *Jobs) StartRebuild(ctx context.Context, projection string, partitions int) (Job, error) {
	if err := j.known(projection); err != nil {
		return Job{}, err
	}
	if partitions < 1 || partitions > MaxPartitions {
		return Job{}, fmt.Errorf("partitions %d: must be 1 to %d: %w", partitions, MaxPartitions, domain.ErrValidation)
	}
	id := newJobID()
	if err := j.lock(ctx, projection, id); err != nil {
		return Job{}, err
	}
	job, err := j.createRebuild(ctx, projection, partitions, id)
	if err != nil {
		_ = j.unlock(context.WithoutCancel(ctx), projection, id)
		return Job{}, err
	}
	return job, nil
}

func (j *Jobs) createRebuild(ctx context.Context, projection string, partitions int, id string) (Job, error) {
	now := j.now().UTC()
	job := Job{ID: id, Kind: KindRebuild, Projection: projection, State: StateQueued, CreatedAt: now,
		Partitions: partitions, Shadow: j.defs[projection] + "_" + strings.ReplaceAll(id, "-", "")}
	// The partitions are cut by the plan task, off the request path: on
	// FerretDB counting and cutting the log means sorting it.
	tasks := []any{
		Task{ID: id + "/" + taskPlan, Job: id, Name: taskPlan, State: taskPending},
		Task{ID: id + "/" + taskFinish, Job: id, Name: taskFinish, State: taskPending},
	}
	if _, err := j.tasks.InsertMany(ctx, tasks); err != nil {
		return Job{}, fmt.Errorf("rebuild %s: tasks: %w", projection, mongoerr.Translate(err))
	}
	// Announce the shadow before the job exists: scans start only a
	// settling time after the job's creation, by which time every
	// projector writes the shadow too.
	_, err := j.pointers.update(ctx, projection, j.defs[projection], func(p *Pointer) (bool, error) {
		if p.Shadow != "" {
			// Left by a rebuild that died before it finished. Retired
			// first, so a crash here cannot leak it; the drop skips any
			// collection a pointer names.
			if err := j.pointers.retire(ctx, projection, p.Shadow, "abandoned shadow", now); err != nil {
				return false, err
			}
		}
		p.Shadow, p.ShadowJob = job.Shadow, id
		return true, nil
	})
	if err != nil {
		return Job{}, fmt.Errorf("rebuild %s: announce %s: %w", projection, job.Shadow, err)
	}
	if _, err := j.jobs.InsertOne(ctx, job); err != nil {
		// Take the announcement back, or projectors would write a shadow
		// no job will finish.
		_, perr := j.pointers.update(context.WithoutCancel(ctx), projection, j.defs[projection], func(p *Pointer) (bool, error) {
			if p.Shadow != job.Shadow {
				return false, nil
			}
			p.Shadow, p.ShadowJob = "", ""
			return true, nil
		})
		return Job{}, errors.Join(fmt.Errorf("rebuild %s: %w", projection, mongoerr.Translate(err)), perr)
	}
	return job, nil
}

// plan cuts a rebuild's log into its partitions and creates their tasks.
// It is idempotent: the cut is saved in the job first, and tasks that
// already exist are kept, so a plan resumed after a crash creates the
// same partitions.
func (j *Jobs) plan(ctx context.Context, job *Job) error {
	save := func(set bson.D) error {
		if _, err := j.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}}, bson.D{{Key: "$set", Value: set}}); err != nil {
			return fmt.Errorf("plan %s: %w", job.ID, mongoerr.Translate(err))
		}
		return nil
	}
	if job.Bounds == nil && job.Partitions <= 1 {
		// One partition needs no cut: it can start while the log is
		// counted for the ETA.
		job.Bounds, job.Partitions = []string{}, 1
		if err := save(bson.D{{Key: "bounds", Value: job.Bounds}, {Key: "partitions", Value: 1}}); err != nil {
			return err
		}
	}
	if job.Bounds == nil {
		total, err := j.log.Commits(ctx)
		if err != nil {
			return err
		}
		bounds, err := j.log.Bounds(ctx, job.Partitions, total)
		if err != nil {
			return err
		}
		job.Bounds, job.TotalCommits, job.Partitions = bounds, total, len(bounds)+1
		if err := save(bson.D{{Key: "bounds", Value: bounds}, {Key: "total_commits", Value: total}, {Key: "partitions", Value: job.Partitions}}); err != nil {
			return err
		}
	}
	edges := append(append([]string{""}, job.Bounds...), "")
	for i := 0; i+1 < len(edges); i++ {
		name := "part-" + strconv.Itoa(i)
		_, err := j.tasks.InsertOne(ctx, Task{ID: job.ID + "/" + name, Job: job.ID, Name: name, From: edges[i], To: edges[i+1], State: taskPending})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("plan %s: %w", job.ID, mongoerr.Translate(err))
		}
	}
	if job.TotalCommits == 0 {
		total, err := j.log.Commits(ctx)
		if err != nil {
			return err
		}
		job.TotalCommits = total
		return save(bson.D{{Key: "total_commits", Value: total}})
	}
	return nil
}

type lockDoc struct {
	ID    string    `bson:"_id"`
	Job   string    `bson:"job_id"`
	Since time.Time `bson:"since"`
}

// lock takes the projection's rebuild lock for job: an insert, so exactly
// one of concurrent requests gets it. A lock whose job has finished, or
// whose job was never created (its creator died), is taken over.
func (j *Jobs) lock(ctx context.Context, projection, job string) error {
	key := "rebuild:" + projection
	for attempt := 0; attempt < 3; attempt++ {
		_, err := j.locks.InsertOne(ctx, lockDoc{ID: key, Job: job, Since: j.now().UTC()})
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongoerr.Translate(err))
		}
		var l lockDoc
		if err := j.locks.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&l); err != nil {
			if errors.Is(err, mongo.ErrNoDocuments) {
				continue
			}
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongoerr.Translate(err))
		}
		held, err := j.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: l.Job}}).Raw()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments) && j.now().Sub(l.Since) < time.Minute:
			return fmt.Errorf("rebuild %s is being created: %w", l.Job, ErrJobRunning)
		case err != nil && !errors.Is(err, mongo.ErrNoDocuments):
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongoerr.Translate(err))
		case err == nil && !JobState(held.Lookup("state").StringValue()).Final():
			return fmt.Errorf("rebuild %s: %w", l.Job, ErrJobRunning)
		}
		if err := j.unlock(ctx, projection, l.Job); err != nil {
			return err
		}
	}
	return fmt.Errorf("rebuild lock of %s: contended: %w", projection, ErrJobRunning)
}

func (j *Jobs) unlock(ctx context.Context, projection, job string) error {
	_, err := j.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: "rebuild:" + projection}, {Key: "job_id", Value: job}})
	if err != nil {
		return fmt.Errorf("rebuild lock of %s: %w", projection, mongoerr.Translate(err))
	}
	return nil
}

// StartVerify creates a verify job of projection's active collection;
// with repair it rewrites the documents that differ from the fold of the
// log. Errors: domain.ErrNotFound for an unknown projection.
func (j *Jobs) StartVerify(ctx context.Context, projection string, repair bool) (Job, error) {
	if err := j.known(projection); err != nil {
		return Job{}, err
	}
	job := Job{ID: newJobID(), Kind: KindVerify, Projection: projection, State: StateQueued, CreatedAt: j.now().UTC(), Repair: repair}
	return job, j.create(ctx, job, taskVerify)
}

// StartReplay creates a job publishing the part of the log spec selects
// to NATS again. Errors: domain.ErrValidation for an invalid spec.
func (j *Jobs) StartReplay(ctx context.Context, spec ReplaySpec) (Job, error) {
	if spec.StreamID != "" {
		if err := domain.ValidateID("stream_id", spec.StreamID); err != nil {
			return Job{}, err
		}
		if !spec.From.IsZero() || !spec.To.IsZero() {
			return Job{}, fmt.Errorf("replay: give a stream or a time range, not both: %w", domain.ErrValidation)
		}
	}
	if !spec.From.IsZero() && !spec.To.IsZero() && !spec.From.Before(spec.To) {
		return Job{}, fmt.Errorf("replay: from must be before to: %w", domain.ErrValidation)
	}
	job := Job{ID: newJobID(), Kind: KindReplay, State: StateQueued, CreatedAt: j.now().UTC(), Replay: &spec}
	return job, j.create(ctx, job, taskReplay)
}

func (j *Jobs) create(ctx context.Context, job Job, task string) error {
	if _, err := j.tasks.InsertOne(ctx, Task{ID: job.ID + "/" + task, Job: job.ID, Name: task, State: taskPending}); err != nil {
		return fmt.Errorf("%s job: %w", job.Kind, mongoerr.Translate(err))
	}
	if _, err := j.jobs.InsertOne(ctx, job); err != nil {
		return fmt.Errorf("%s job: %w", job.Kind, mongoerr.Translate(err))
	}
	return nil
}

// Get returns a job with its tasks and progress. Errors:
// domain.ErrNotFound for an unknown id.
func (j *Jobs) Get(ctx context.Context, id string) (Job, error) {
	var job Job
	err := j.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&job)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Job{}, fmt.Errorf("job %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("job %s: %w", id, mongoerr.Translate(err))
	}
	tasks, err := j.jobTasks(ctx, id)
	if err != nil {
		return Job{}, err
	}
	job.Tasks = tasks
	var commits int64
	for _, t := range tasks {
		if t.State == taskRunning && !job.State.Final() {
			job.State = StateRunning
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

func (j *Jobs) jobTasks(ctx context.Context, job string) ([]Task, error) {
	cur, err := j.tasks.Find(ctx, bson.D{{Key: "job", Value: job}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("tasks of %s: %w", job, mongoerr.Translate(err))
	}
	tasks := []Task{}
	if err := cur.All(ctx, &tasks); err != nil {
		return nil, fmt.Errorf("tasks of %s: %w", job, mongoerr.Translate(err))
	}
	// Partitions in order, the finish last.
	rank := func(t Task) int {
		switch t.Name {
		case taskPlan:
			return -1
		case taskFinish:
			return math.MaxInt
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(t.Name, "part-"))
		return n
	}
	slices.SortFunc(tasks, func(a, b Task) int { return cmp.Compare(rank(a), rank(b)) })
	return tasks, nil
}

// Cancel asks a job to stop. Its runners stop at their next checkpoint; a
// canceled rebuild leaves the active collection as it was and drops its
// shadow. A rebuild whose finish has verified its shadow and recorded the
// collection it replaces (Job.Replaced) is committed to the switch: a
// cancel is too late and refused as finished, and the job ends succeeded.
// The request and that commit are each one update filtered on the other's
// field, so when they race exactly one of them wins. Errors:
// domain.ErrNotFound, ErrJobFinished (a final job, or a rebuild committed
// to its switch).
func (j *Jobs) Cancel(ctx context.Context, id string) (Job, error) {
	job, err := j.Get(ctx, id)
	if err != nil {
		return Job{}, err
	}
	if job.State.Final() {
		return job, fmt.Errorf("job %s is %s: %w", id, job.State, ErrJobFinished)
	}
	if job.Replaced != "" {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, ErrJobFinished)
	}
	res, err := j.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "replaced", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "cancel_requested", Value: true}}}})
	if err != nil {
		return Job{}, fmt.Errorf("cancel %s: %w", id, mongoerr.Translate(err))
	}
	if res.MatchedCount == 0 {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, ErrJobFinished)
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
		return false, fmt.Errorf("cancel request of %s: %w", id, mongoerr.Translate(err))
	}
	return job.CancelRequested, nil
}

// Latest returns the most recent job of a kind for a projection, or nil.
func (j *Jobs) Latest(ctx context.Context, projection string, kind JobKind) (*Job, error) {
	var job Job
	err := j.jobs.FindOne(ctx, bson.D{{Key: "projection", Value: projection}, {Key: "kind", Value: kind}},
		options.FindOne().SetSort(bson.D{{Key: "created_at", Value: -1}})).Decode(&job)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest %s of %s: %w", kind, projection, mongoerr.Translate(err))
	}
	return &job, nil
}

// finishJob writes a job's final state.
func (j *Jobs) finishJob(ctx context.Context, id string, state JobState, errMsg string, report *VerifyReport) error {
	set := bson.D{{Key: "state", Value: state}, {Key: "finished_at", Value: j.now().UTC()}}
	if errMsg != "" {
		set = append(set, bson.E{Key: "error", Value: errMsg})
	}
	if report != nil {
		set = append(set, bson.E{Key: "report", Value: report})
	}
	if _, err := j.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: set}}); err != nil {
		return fmt.Errorf("finish job %s: %w", id, mongoerr.Translate(err))
	}
	return nil
}
