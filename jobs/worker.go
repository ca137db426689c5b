package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// WorkerConfig tunes a Worker. Zero values take the defaults in brackets.
type WorkerConfig struct {
	Owner    string        // instance id, recorded in claims
	LeaseTTL time.Duration // a claim's lifetime, renewed every TTL/3 [15s]
	Poll     time.Duration // look for claimable tasks this often [1s]
	// Concurrency is how many tasks this worker runs at once [4]: the
	// partitions of a rebuild are tasks, so a rebuild of up to 4
	// partitions scans them all at once on one instance; more wait for a
	// free slot here or on another instance.
	Concurrency  int
	BatchStreams int // streams folded and written per checkpoint [500]
	// MaxEventsPerSecond paces each rebuild task (0: as fast as the store
	// goes), to spare a production store.
	MaxEventsPerSecond float64
	// Settle is the wait after a shadow is announced before scanning
	// [DefaultSettle]; it must be longer than projection.WriterPointerAge,
	// so that every event the scan does not read goes to the shadow live.
	Settle      time.Duration
	Grace       time.Duration // keep a replaced collection (fed by its version's projectors, for a switch back) before dropping it [15m]
	MaxAttempts int           // claims of a failing task before the job fails [5]
	// Metrics receives the rebuild progress of this instance
	// (orderd_rebuild_*); nil records nothing.
	Metrics *Metrics
	// Retired names projections that earlier versions of the service ran
	// and this one does not (projection.Retired): their collections are
	// dropped once Grace has passed since this worker first saw them.
	Retired []string
}

// DefaultConcurrency is WorkerConfig.Concurrency's default. With one task
// at a time, a rebuild asked for in partitions scanned them one after
// another on a single instance.
const DefaultConcurrency = 4

// WithDefaults returns c with its zero fields set to the defaults in
// brackets, for a program that shows or checks them before NewWorker.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 15 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.BatchStreams <= 0 {
		c.BatchStreams = 500
	}
	if c.Grace <= 0 {
		c.Grace = 15 * time.Minute
	}
	if c.Settle <= 0 {
		c.Settle = DefaultSettle
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	return c
}

// DefaultSettle is WorkerConfig.Settle when it is not set: longer than
// projection.WriterPointerAge, with room for the pointer read's own time.
const DefaultSettle = 250 * time.Millisecond

// Projection is a read model as the jobs see it, whatever its document
// type: projection.Model[D] and projection.Rollup implement it. Its
// pointer is read through Jobs's Pointers. coll names one of the
// projection's collections (a pointer's active or shadow). Every method
// fails with domain.ErrUnavailable when the store cannot be reached.
type Projection interface {
	Name() string       // projection.Definition.Name
	Collection() string // projection.Definition.Collection, the base collection
	Version() int       // of the definition this process folds (projection.Definition.Ver)
	// EnsureIndexes creates the projection's indexes on the collections
	// of its version the pointer names (a rebuild's shadow among them).
	EnsureIndexes(ctx context.Context) error
	// WriteFolds folds each stream of a rebuild's batch into coll through
	// the version guard, and records each document's version and hash in
	// projection.SumsCollection(coll). A stream that cannot be folded is
	// counted as poison, not an error.
	WriteFolds(ctx context.Context, coll string, streams []domain.StreamEvents) (projection.FoldResult, error)
	// VerifySums compares coll with the sums a rebuild recorded in
	// projection.SumsCollection(coll), folding again only the documents
	// that do not match them, and with repair rewrites what differs;
	// progress (nil: none) is called as it goes, and its error stops the
	// verify. Errors: domain.ErrPointerMoved (wrapped) when a repair finds
	// coll no longer named by the pointer, progress's and the log's.
	VerifySums(ctx context.Context, coll string, repair bool, progress func(projection.VerifyProgress) error) (projection.VerifyReport, error)
}

// folder is a projection verified against the fold of the whole log
// (projection.Model.Verify): by a verify job, and by the finish of a
// rebuild part of whose scan recorded no sums. Verify's errors are
// VerifySums's, and the log's.
type folder interface {
	Projection
	Verify(ctx context.Context, coll string, log projection.Scanner, repair bool, progress func(projection.VerifyProgress) error) (projection.VerifyReport, error)
}

// starter is a projection whose build starts its shadow itself, before
// the plan, and whose scan may start only at the time that returns
// (projection.Rollup.Prepare: idempotent, a plan or scan run again gets
// the same time).
type starter interface {
	Prepare(ctx context.Context, shadow string) (time.Time, error)
}

// comparer is a projection verified by a build compared with the active
// collection (projection.Rollup.Compare), caught up with it.
type comparer interface {
	Compare(ctx context.Context, coll, active string) (projection.VerifyReport, error)
}

// Worker runs the jobs' tasks: any number of instances may run a
// Worker; each task is run by exactly one of them at a time (see claim),
// and a task whose runner died is resumed by another from its saved cursor
// once the lease has run out. It also drops retired collections.
type Worker struct {
	jobs   *Jobs
	events EventLog
	pub    Publisher
	cfg    WorkerConfig
	l      *slog.Logger
	// slots holds one token per task this worker runs, up to
	// Concurrency.
	slots chan struct{}
}

// Publisher publishes events again, each with its event id as
// Nats-Msg-Id, and returns how many were acknowledged
// (bus.Publisher.Republish).
type Publisher func(ctx context.Context, events []domain.Event) (int, error)

// NewWorker returns a worker for jobs on their projections, reading log
// and republishing through pub (nil: replay jobs are left to other
// instances).
func NewWorker(jobs *Jobs, events EventLog, pub Publisher, cfg WorkerConfig, l *slog.Logger) *Worker {
	cfg = cfg.WithDefaults()
	for name := range jobs.projs {
		cfg.Metrics.initRebuild(name)
	}
	return &Worker{jobs: jobs, events: events, pub: pub, cfg: cfg, l: l.With("component", "jobs"),
		slots: make(chan struct{}, cfg.Concurrency)}
}

// Run claims and runs tasks until ctx is done, then releases the tasks it
// holds (keeping their cursors) and returns nil. It looks for tasks every
// Poll, and at once when a task of its own ends, when a job is created in
// this process, and when a rebuild's settling time ends.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTimer(w.cfg.Poll)
	defer t.Stop()
	wg.Go(func() { w.dropRetired(ctx) })
	for {
		w.buildVersions(ctx)
		wait := w.cfg.Poll
		for len(w.slots) < cap(w.slots) && ctx.Err() == nil {
			c, job, settled, err := w.claimNext(ctx)
			if !settled.IsZero() {
				wait = min(wait, max(settled.Sub(w.jobs.now()), 0))
			}
			if err != nil {
				if ctx.Err() == nil {
					w.l.Warn("looking for tasks failed", "err", err)
				}
				break
			}
			if c == nil {
				break
			}
			w.slots <- struct{}{}
			wg.Go(func() {
				w.execute(ctx, c, job)
				<-w.slots
				w.jobs.wake()
			})
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-w.jobs.ready:
		}
	}
}

// dropRetired drops retired collections whose time has come, on its own
// schedule: a drop may wait for the store's locks, and must not hold up
// claims.
func (w *Worker) dropRetired(ctx context.Context) {
	t := time.NewTicker(w.cfg.Poll)
	defer t.Stop()
	retiring := slices.Clone(w.cfg.Retired) // until each is done once
	for {
		retiring = slices.DeleteFunc(retiring, func(name string) bool {
			err := w.jobs.pointers.RetireProjection(ctx, name, w.jobs.now().Add(w.cfg.Grace))
			if err != nil && ctx.Err() == nil {
				w.l.Warn("retiring a projection failed", "projection", name, "err", err)
			}
			return err == nil
		})
		if dropped, err := w.jobs.pointers.DropRetired(ctx, w.jobs.now()); err != nil && ctx.Err() == nil {
			w.l.Warn("dropping retired collections failed", "err", err)
		} else if len(dropped) > 0 {
			w.l.Info("dropped retired collections", "collections", dropped)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claimNext claims the first claimable task, or returns nil and, when a
// rebuild's scan waits for its settling time to end, the time it ends
// (settled).
func (w *Worker) claimNext(ctx context.Context) (c *claim, job Job, settled time.Time, err error) {
	open, err := w.jobs.store.OpenTasks(ctx, taskPending, taskRunning)
	if err != nil {
		return nil, Job{}, settled, err
	}
	now := w.jobs.now()
	jobs := map[string]*Job{}
	for _, t := range open {
		if t.State == taskRunning && now.Before(t.LeaseUntil) {
			continue
		}
		job, ok := jobs[t.Job]
		if !ok {
			j, err := w.jobs.Get(ctx, t.Job)
			if errors.Is(err, domain.ErrNotFound) {
				jobs[t.Job] = nil // tasks of a job whose creator died
				continue
			}
			if err != nil {
				return nil, Job{}, settled, err
			}
			job, jobs[t.Job] = &j, &j
		}
		if job == nil || job.State.Final() {
			continue
		}
		ok, at := w.claimable(t, job, now)
		if !ok {
			if !at.IsZero() && (settled.IsZero() || at.Before(settled)) {
				settled = at
			}
			continue
		}
		c, err := w.jobs.tryClaim(ctx, t, w.cfg.Owner, w.cfg.LeaseTTL)
		if err != nil {
			return nil, Job{}, settled, err
		}
		if c != nil {
			return c, *job, settled, nil
		}
	}
	return nil, Job{}, settled, nil
}

// claimable says whether this worker may take t now (job holds its
// sibling tasks), and if it may not only because the rebuild's settling
// time has not ended, when it ends.
func (w *Worker) claimable(t Task, job *Job, now time.Time) (bool, time.Time) {
	if job.Kind == KindReplay && w.pub == nil {
		return false, time.Time{}
	}
	if job.Projection != "" {
		// A job folds with one version of the definition: only a
		// process that folds that version may run it. The clean-up of
		// an older version's canceled rebuild folds nothing: a newer
		// version's worker may run it (buildVersions cancels such a
		// rebuild when no worker of its version is left to).
		p := w.jobs.projs[job.Projection]
		if p == nil || (job.Kind != KindReplay && max(job.Version, 1) != p.Version() && !cleansUpOlder(t, job, p.Version())) {
			return false, time.Time{}
		}
	}
	if !job.builds() {
		return true, time.Time{}
	}
	failed, live, final, planned, parts := false, false, true, false, 0
	for _, s := range job.Tasks {
		if s.Name == taskPlan {
			planned = s.State == taskDone
		}
		if s.Name == taskFinish {
			continue
		}
		if s.Name != taskPlan {
			parts++
		}
		failed = failed || s.State == taskFailed
		live = live || (s.State == taskRunning && now.Before(s.LeaseUntil))
		final = final && (s.State == taskDone || s.State == taskFailed || s.State == taskCanceled)
	}
	stop := failed || job.CancelRequested
	switch t.Name {
	case taskFinish:
		return (final && planned && parts == job.Partitions) || (stop && !live), time.Time{}
	case taskPlan:
		return !stop, time.Time{}
	}
	if settled := job.CreatedAt.Add(w.cfg.Settle); !stop && now.Before(settled) {
		return false, settled
	}
	return !stop, time.Time{}
}

// cleansUpOlder reports whether t is the finish of a rebuild of a version
// older than v that was canceled before it could switch: that finish only
// cleans up.
func cleansUpOlder(t Task, job *Job, v int) bool {
	return job.builds() && t.Name == taskFinish && job.CancelRequested && job.Replaced == "" && max(job.Version, 1) < v
}

// errJobCanceled: an operator asked the job to stop.
var errJobCanceled = errors.New("job canceled")

// execute runs a claimed task, renewing its lease, and records how it
// ended: done (the task did), canceled, released for a retry, or failed
// after MaxAttempts.
func (w *Worker) execute(ctx context.Context, c *claim, job Job) {
	l := w.l.With("job", job.ID, "kind", job.Kind, "projection", job.Projection, "task", c.task.Name, "epoch", c.task.Epoch)
	if job.builds() {
		w.cfg.Metrics.rebuildTaskStarted(job.Projection, job.ID)
		defer w.cfg.Metrics.rebuildTaskEnded(job.Projection)
	}
	if len(c.task.Resumes) > 0 {
		r := c.task.Resumes[len(c.task.Resumes)-1]
		l.Info("resuming task", "cursor", r.Cursor, "streams_done", r.Streams, "events_done", r.Events)
	} else {
		l.Info("starting task")
	}
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(w.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
			}
			if err := c.renew(tctx); err != nil {
				if errors.Is(err, domain.ErrLeaseLost) || !c.valid() {
					cancel(domain.ErrLeaseLost)
					return
				}
				l.Warn("lease renewal failed", "err", err)
			}
		}
	}()
	err := w.runTask(tctx, c, job)
	cancel(nil)
	<-renewed
	bg := context.WithoutCancel(ctx)
	switch {
	case err == nil:
		l.Info("task done")
	case errors.Is(context.Cause(tctx), domain.ErrLeaseLost) || errors.Is(err, domain.ErrLeaseLost):
		l.Warn("task lease lost: it ran out before a renewal got through, or another instance took the task")
	case errors.Is(err, errJobCanceled):
		l.Info("task canceled")
		if job.builds() && c.task.Name == taskFinish {
			// Canceled during the verify before the switch.
			job.CancelRequested = true
			if err := w.cleanUp(bg, job); err != nil {
				l.Warn("cleaning up the canceled rebuild failed", "err", err)
			}
		} else if !job.builds() {
			_ = w.jobs.store.FinishJob(bg, job.ID, StateCanceled, "", nil)
		}
		if err := c.finish(bg, taskCanceled, ""); err != nil {
			l.Warn("recording cancel failed", "err", err)
		}
	case ctx.Err() != nil:
		l.Info("task released at shutdown", "cursor", c.task.Cursor)
		_ = c.release(bg, "")
	case c.task.Attempts >= w.cfg.MaxAttempts:
		l.Error("task failed", "err", err, "attempts", c.task.Attempts)
		_ = c.finish(bg, taskFailed, err.Error())
		if !job.builds() || c.task.Name == taskFinish {
			_ = w.jobs.store.FinishJob(bg, job.ID, StateFailed, err.Error(), nil)
			if job.builds() {
				_ = w.cleanUp(bg, job)
			}
		}
	default:
		l.Warn("task failed; released for a retry", "err", err, "attempts", c.task.Attempts)
		_ = c.release(bg, err.Error())
	}
}

func (w *Worker) runTask(ctx context.Context, c *claim, job Job) error {
	switch {
	case job.builds() && c.task.Name == taskPlan:
		if s, ok := w.jobs.projs[job.Projection].(starter); ok {
			if _, err := s.Prepare(ctx, job.Shadow); err != nil {
				return err
			}
		}
		if err := w.jobs.plan(ctx, &job); err != nil {
			return err
		}
		return c.finish(ctx, taskDone, "")
	case job.builds() && c.task.Name == taskFinish:
		return w.finishRebuild(ctx, c, job)
	case job.builds():
		return w.scan(ctx, c, job)
	case job.Kind == KindVerify:
		return w.verify(ctx, c, job)
	case job.Kind == KindReplay:
		return w.replay(ctx, c, job)
	}
	return fmt.Errorf("task %s: unknown kind %q", c.task.ID, job.Kind)
}

// progress checkpoints t and checks for a cancel request.
func (w *Worker) progress(ctx context.Context, c *claim, t *Task) error {
	if err := c.checkpoint(ctx, t); err != nil {
		return err
	}
	c.task = *t
	job, err := w.jobs.store.Job(ctx, t.Job)
	if err != nil {
		return err
	}
	if job.CancelRequested {
		return errJobCanceled
	}
	return nil
}

// buildVersions starts, for each projection whose store has not built the
// version of the definition this process folds, a rebuild that builds it
// (its verified switch is the cutover): a definition bumped by a deploy,
// or a projection new to a service whose log holds events. The rebuild
// lock makes it one rebuild however many instances try; a rebuild already
// running (of any version) is waited for. A version an operator switched
// back from is not built again; a newer one is. An older binary, during a
// rolling upgrade, finds the store ahead of it and builds nothing.
func (w *Worker) buildVersions(ctx context.Context) {
	for _, name := range w.jobs.Projections() {
		p := w.jobs.projs[name]
		if p == nil || ctx.Err() != nil {
			continue
		}
		ptr, err := w.jobs.pointers.Get(ctx, name, p.Collection(), buildCheckAge)
		if err != nil {
			continue // the store is away; the next round asks again
		}
		v := p.Version()
		w.cfg.Metrics.pointer(name, v, ptr)
		// A collection of this version that lost log positions
		// (projection.Pointer.Broken) is built again too.
		built := ptr.ActiveVer() > v || (ptr.ActiveVer() == v && ptr.Broken == "")
		if ptr.Generation == 0 || built || ptr.ShadowVer() == v || ptr.SwitchedBackFrom >= v {
			continue
		}
		job, err := w.jobs.StartRebuild(ctx, name, 1)
		switch {
		case err == nil:
			w.l.Info("building a version of a read model the store does not hold", "projection", name, "version", v,
				"active_version", ptr.ActiveVer(), "job", job.ID)
		case errors.Is(err, domain.ErrJobRunning):
			// Another instance started it, or a rebuild runs: wait,
			// unless it builds an older version, which this one
			// supersedes.
			w.supersede(ctx, ptr.ShadowJob, name, v)
		case ctx.Err() == nil:
			w.l.Warn("starting the build of a read-model version failed", "projection", name, "version", v, "err", err)
		}
	}
}

// supersede cancels rebuild id, whose shadow projection name's pointer
// names, when it builds a version older than v and has not recorded its
// switch: once v is built it replaces whatever that rebuild would switch
// to, and during or after a rolling upgrade no worker of the older
// version may be left to run it, so it would hold the rebuild lock for
// ever. Its clean-up may then run on this version's workers
// (cleansUpOlder).
func (w *Worker) supersede(ctx context.Context, id, name string, v int) {
	if id == "" {
		return // a switch back, or a rebuild not yet announced: wait
	}
	job, err := w.jobs.Get(ctx, id)
	if err != nil || !job.builds() || job.State.Final() || job.CancelRequested || job.Replaced != "" || max(job.Version, 1) >= v {
		return
	}
	if _, err := w.jobs.Cancel(ctx, id); err != nil {
		if ctx.Err() == nil && !errors.Is(err, domain.ErrJobFinished) {
			w.l.Warn("canceling an older version's rebuild failed", "projection", name, "job", id, "err", err)
		}
		return
	}
	w.l.Info("canceled a rebuild of an older version: this version's build replaces it", "projection", name, "job", id,
		"job_version", max(job.Version, 1), "version", v)
}

// buildCheckAge is how old a pointer buildVersions may act on: a version
// bumped by a deploy is noticed within it, at one pointer read per
// projection per interval.
const buildCheckAge = 5 * time.Second
