package jobs

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
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
// mongodb.EventStore implements it.
type EventLog interface {
	Load(ctx context.Context, streamID string, after int64) ([]domain.Event, error)
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
	Commits(ctx context.Context) (int64, error)
	Bounds(ctx context.Context, n int) (bounds []string, commits int64, err error)
}

// Jobs stores jobs and their tasks, and creates, reads and cancels them.
type Jobs struct {
	store    Store
	leases   TaskLeases
	pointers *mongodb.Pointers
	events   EventLog
	defs     map[string]string // projection name -> base collection
	now      func() time.Time
}

// New returns the jobs kept in store, their tasks claimed through leases
// (the MongoDB adapter's mongodb.NewJobs and mongodb.NewTasks), for the
// projections named in defs (projection name to its
// projection.Definition's Collection), whose pointer documents ps keeps,
// reading events.
func New(store Store, leases TaskLeases, ps *mongodb.Pointers, events EventLog, defs map[string]string) *Jobs {
	return &Jobs{store: store, leases: leases, pointers: ps, events: events, defs: defs, now: time.Now}
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
	if err := j.store.InsertTasks(ctx, []domain.Task{{ID: job.ID + "/" + task, Job: job.ID, Name: task, State: taskPending}}); err != nil {
		return err
	}
	return j.store.InsertJob(ctx, job)
}

// Get returns a job with its tasks and progress. Errors:
// domain.ErrNotFound for an unknown id.
func (j *Jobs) Get(ctx context.Context, id string) (domain.Job, error) {
	job, err := j.store.Job(ctx, id)
	if err != nil {
		return domain.Job{}, err
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
	tasks, err := j.store.Tasks(ctx, job)
	if err != nil {
		return nil, err
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
	requested, err := j.store.RequestCancel(ctx, id)
	if err != nil {
		return domain.Job{}, err
	}
	if !requested {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, domain.ErrJobFinished)
	}
	job.CancelRequested = true
	return job, nil
}

// cancelRequested reports whether an operator asked job id to stop.
func (j *Jobs) cancelRequested(ctx context.Context, id string) (bool, error) {
	return j.store.CancelRequested(ctx, id)
}

// Latest returns the most recent job of a kind for a projection, or nil.
func (j *Jobs) Latest(ctx context.Context, projection string, kind domain.JobKind) (*domain.Job, error) {
	return j.store.Latest(ctx, projection, kind)
}

// finishJob writes a job's final state.
func (j *Jobs) finishJob(ctx context.Context, id string, state domain.JobState, errMsg string, report *domain.VerifyReport) error {
	return j.store.FinishJob(ctx, id, state, errMsg, report)
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
