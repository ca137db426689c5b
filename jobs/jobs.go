package jobs

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
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
// The MongoDB adapter's *mongodb.EventStore implements it. Errors:
// domain.ErrUnavailable, and Scan returns fn's.
type EventLog interface {
	Load(ctx context.Context, streamID string, after int64) ([]domain.Event, error)
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
	Commits(ctx context.Context) (int64, error)
	Bounds(ctx context.Context, n int) (bounds []string, commits int64, err error)
}

// Jobs stores jobs and their tasks, and creates, reads and cancels them.
type Jobs struct {
	store    Store
	pointers Pointers
	events   EventLog
	projs    map[string]Projection // by name
	now      func() time.Time
	// ready wakes a Worker of this process when a job is created or a
	// task of it ends, so that the next task does not wait for the next
	// poll.
	ready chan struct{}
}

// New returns the jobs kept in store (the MongoDB adapter's
// mongodb.NewJobs), on projs, whose pointer documents ps keeps, reading
// events.
func New(store Store, ps Pointers, events EventLog, projs ...Projection) *Jobs {
	m := map[string]Projection{}
	for _, p := range projs {
		m[p.Name()] = p
	}
	return &Jobs{store: store, pointers: ps, events: events, projs: m, now: time.Now, ready: make(chan struct{}, 1)}
}

// Projections returns the names of the projections, sorted.
func (j *Jobs) Projections() []string { return slices.Sorted(maps.Keys(j.projs)) }

func (j *Jobs) known(projection string) error {
	if _, ok := j.projs[projection]; !ok {
		return fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	return nil
}

func newJobID() string { return uuid.Must(uuid.NewV7()).String() }

func (j *Jobs) create(ctx context.Context, job Job, task string) error {
	if err := j.store.InsertTasks(ctx, []Task{{ID: job.ID + "/" + task, Job: job.ID, Name: task, State: taskPending}}); err != nil {
		return err
	}
	if err := j.store.InsertJob(ctx, job); err != nil {
		return err
	}
	j.wake()
	return nil
}

// wake tells a Worker of this process that a task may be claimable.
func (j *Jobs) wake() {
	select {
	case j.ready <- struct{}{}:
	default:
	}
}

// Get returns a job with its tasks and progress: its state as its tasks
// show it (running once one runs, while the stored state is still
// queued), its counters, rate and ETA, and its phase (Job.PhaseAt).
// Every view of a job reads it through Get, so they all show the same.
// Errors: domain.ErrNotFound for an unknown id.
func (j *Jobs) Get(ctx context.Context, id string) (Job, error) {
	job, err := j.store.Job(ctx, id)
	if err != nil {
		return Job{}, err
	}
	return job, j.fill(ctx, &job)
}

// fill adds job's tasks, progress and phase to job as stored.
func (j *Jobs) fill(ctx context.Context, job *Job) error {
	tasks, err := j.store.Tasks(ctx, job.ID)
	if err != nil {
		return err
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
	job.Tasks = tasks
	job.count(j.now())
	job.JobPhase = job.PhaseAt(j.now())
	return nil
}

// Cancel asks a job to stop. Its runners stop at their next checkpoint; a
// canceled rebuild leaves the active collection as it was and drops its
// shadow. A rebuild whose finish has verified its shadow and recorded the
// collection it replaces (Job.Replaced) is committed to the switch: a
// cancel is too late and refused as finished, and the job ends succeeded.
// The request and that commit are each one update filtered on the other's
// field, so when they race exactly one of them wins. Errors:
// domain.ErrNotFound, domain.ErrJobFinished (a final job, or a rebuild committed
// to its switch).
func (j *Jobs) Cancel(ctx context.Context, id string) (Job, error) {
	job, err := j.Get(ctx, id)
	if err != nil {
		return Job{}, err
	}
	if job.State.Final() {
		return job, fmt.Errorf("job %s is %s: %w", id, job.State, domain.ErrJobFinished)
	}
	requested, err := j.store.RequestCancel(ctx, id)
	if err != nil {
		return Job{}, err
	}
	if !requested {
		return job, fmt.Errorf("rebuild %s switches the read model to %s: too late to cancel: %w", id, job.Shadow, domain.ErrJobFinished)
	}
	job.CancelRequested = true
	return job, nil
}

// SwitchBack points readers of projection back at the collection the last
// switch replaced (its previous version, or the same version before a
// rebuild), kept and fed by the projectors of its version for the rebuild
// grace after that switch; the collection it leaves becomes the previous
// one, to be dropped when the restored one would have been. A version
// switched back from is not built again on its own (see
// Worker.buildVersions); a newer one is. It holds the projection's
// rebuild lock while it works, so no rebuild switches at the same time.
// It returns the pointer as stored. Errors: domain.ErrNotFound for an
// unknown projection, domain.ErrNoPrevious when there is nothing to switch
// back to, domain.ErrJobRunning while a rebuild runs, domain.ErrUnavailable.
func (j *Jobs) SwitchBack(ctx context.Context, name string) (projection.Pointer, error) {
	if err := j.known(name); err != nil {
		return projection.Pointer{}, err
	}
	id := newJobID()
	if err := j.store.Lock(ctx, name, id); err != nil {
		return projection.Pointer{}, err
	}
	defer func() { _ = j.store.Unlock(context.WithoutCancel(ctx), name, id) }()
	coll := j.projs[name].Collection()
	ptr, err := j.pointers.Get(ctx, name, coll, 0)
	if err != nil {
		return projection.Pointer{}, err
	}
	if ptr.Previous == "" {
		return ptr, fmt.Errorf("%s: %w", name, domain.ErrNoPrevious)
	}
	dropAfter, ok, err := j.pointers.DropAfter(ctx, ptr.Previous)
	if err != nil {
		return projection.Pointer{}, err
	}
	if !ok {
		dropAfter = j.now().Add(time.Minute)
	}
	// Retired before the switch, so a crash after it cannot keep the
	// collection left for ever; while it is still active the drop skips
	// it.
	if ptr.Active != "" {
		if err := j.pointers.Retire(ctx, name, ptr.Active, "switched back from", dropAfter); err != nil {
			return projection.Pointer{}, err
		}
	}
	restored := ptr.Previous
	ptr, err = j.pointers.Update(ctx, name, coll, func(p *projection.Pointer) (bool, error) {
		if p.Previous != restored {
			return false, fmt.Errorf("%s: %w", name, domain.ErrNoPrevious) // dropped meanwhile
		}
		from := p.ActiveVer()
		p.Active, p.ActiveVersion, p.Previous, p.PreviousVersion = p.Previous, p.PreviousVer(), p.Active, p.ActiveVer()
		if from > p.ActiveVersion {
			p.SwitchedBackFrom = from
		}
		p.SwitchedAt = j.now().UTC()
		p.Broken = "" // of the collection left
		return true, nil
	})
	if err != nil {
		return ptr, err
	}
	return ptr, j.pointers.Unretire(ctx, restored)
}

// latest returns the most recent job of a kind for a projection as Get
// returns it (its state and progress from its tasks), or nil. The stored
// job alone says queued until the job ends.
func (j *Jobs) latest(ctx context.Context, projection string, kind JobKind) (*Job, error) {
	job, err := j.store.Latest(ctx, projection, kind)
	if err != nil || job == nil {
		return job, err
	}
	if err := j.fill(ctx, job); err != nil {
		return nil, fmt.Errorf("job %s of %s: %w", job.ID, projection, err)
	}
	return job, nil
}

// DeadLetterCounter counts a projection's dead letters. The MongoDB
// adapter's *mongodb.DeadLetters implements it. Errors:
// domain.ErrUnavailable.
type DeadLetterCounter interface {
	Count(ctx context.Context, projection string) (int64, error)
}

// Status returns each projection's pointer, latest verify and rebuild,
// and dead letters; lag (nil when unknown) and last error come from the
// callers that know them (the projection runners).
func (j *Jobs) Status(ctx context.Context, dead DeadLetterCounter, lag func(ctx context.Context, name string) (*uint64, string)) ([]ProjectionStatus, error) {
	var out []ProjectionStatus
	for _, name := range j.Projections() {
		ptr, err := j.pointers.Get(ctx, name, j.projs[name].Collection(), 0)
		if err != nil {
			return nil, err
		}
		st := ProjectionStatus{Name: name, Version: j.projs[name].Version(), ActiveCollection: ptr.Active, ActiveVersion: ptr.ActiveVer(),
			ShadowCollection: ptr.Shadow, ShadowVersion: ptr.ShadowVer(), PreviousCollection: ptr.Previous, PreviousVersion: ptr.PreviousVer(),
			SwitchedBackFrom: ptr.SwitchedBackFrom, Generation: ptr.Generation, SwitchedAt: ptr.SwitchedAt}
		if lag != nil {
			st.ConsumerLag, st.LastError = lag(ctx, name)
		}
		if dead != nil {
			if st.DeadLetters, err = dead.Count(ctx, name); err != nil {
				return nil, err
			}
		}
		v, err := j.latest(ctx, name, KindVerify)
		if err != nil {
			return nil, err
		}
		if v != nil {
			vs := &VerifySummary{Job: v.ID, State: v.State, FinishedAt: v.FinishedAt}
			if v.Report != nil {
				vs.Drift, vs.Repaired, vs.Digest = v.Report.Drift(), v.Report.Repaired, v.Report.Digest
			}
			st.LastVerify = vs
		}
		r, err := j.latest(ctx, name, KindRebuild)
		if err != nil {
			return nil, err
		}
		if r != nil {
			sum := r.Summary()
			st.LastRebuild = &sum
			if r.Error != "" && st.LastError == "" {
				st.LastError = "rebuild: " + r.Error
			}
		}
		out = append(out, st)
	}
	return out, nil
}
