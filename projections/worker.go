package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// WorkerConfig tunes a Worker. Zero values take the defaults in brackets.
type WorkerConfig struct {
	Owner        string        // instance id, recorded in claims
	LeaseTTL     time.Duration // a claim's lifetime, renewed every TTL/3 [15s]
	Poll         time.Duration // look for claimable tasks this often [1s]
	Concurrency  int           // tasks run at once by this worker [1]
	BatchStreams int           // streams folded and written per checkpoint [500]
	// MaxEventsPerSecond paces each rebuild task (0: as fast as the store
	// goes), to spare a production store.
	MaxEventsPerSecond float64
	Settle             time.Duration // wait after a shadow is announced before scanning [2s]
	Grace              time.Duration // keep a replaced collection before dropping it [1m]
	MaxAttempts        int           // claims of a failing task before the job fails [5]
	// Metrics receives the rebuild progress of this instance
	// (orderd_rebuild_*); nil records nothing.
	Metrics *Metrics
}

// Worker runs the repair jobs' tasks: any number of instances may run a
// Worker; each task is run by exactly one of them at a time (see claim),
// and a task whose runner died is resumed by another from its saved cursor
// once the lease has run out. It also drops retired collections.
type Worker struct {
	jobs  *Jobs
	log   Log
	pub   Publisher
	projs map[string]Managed
	cfg   WorkerConfig
	l     *slog.Logger
	wake  chan struct{}

	mu      sync.Mutex
	running map[string]bool
}

// Publisher publishes events again, each with its event id as
// Nats-Msg-Id, and returns how many were acknowledged
// (eventstore.Republish).
type Publisher func(ctx context.Context, events []domain.Event) (int, error)

// NewWorker returns a worker for jobs on the projections projs, reading
// log and republishing through pub (nil: replay jobs are left to other
// instances).
func NewWorker(jobs *Jobs, log Log, pub Publisher, projs []Managed, cfg WorkerConfig, l *slog.Logger) *Worker {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.BatchStreams <= 0 {
		cfg.BatchStreams = 500
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	m := map[string]Managed{}
	for _, p := range projs {
		m[p.Name()] = p
		cfg.Metrics.initRebuild(p.Name())
	}
	return &Worker{jobs: jobs, log: log, pub: pub, projs: m, cfg: cfg, l: l.With("component", "jobs"),
		wake: make(chan struct{}, 1), running: map[string]bool{}}
}

// Run claims and runs tasks until ctx is done, then releases the tasks it
// holds (keeping their cursors) and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(w.cfg.Poll)
	defer t.Stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.dropRetired(ctx)
	}()
	for {
		for w.busy() < w.cfg.Concurrency && ctx.Err() == nil {
			c, job, err := w.claimNext(ctx)
			if err != nil {
				if ctx.Err() == nil {
					w.l.Warn("looking for tasks failed", "err", err)
				}
				break
			}
			if c == nil {
				break
			}
			w.setRunning(c.task.ID, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer w.setRunning(c.task.ID, false)
				w.execute(ctx, c, job)
				select {
				case w.wake <- struct{}{}:
				default:
				}
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-w.wake:
		}
	}
}

// dropRetired drops retired collections whose time has come, on its own
// schedule: a drop may wait for the store's locks, and must not hold up
// claims.
func (w *Worker) dropRetired(ctx context.Context) {
	t := time.NewTicker(w.cfg.Poll)
	defer t.Stop()
	for {
		if dropped, err := w.jobs.pointers.dropRetired(ctx, w.jobs.now()); err != nil && ctx.Err() == nil {
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

func (w *Worker) busy() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

func (w *Worker) setRunning(id string, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if on {
		w.running[id] = true
	} else {
		delete(w.running, id)
	}
}

// claimNext claims the first claimable task, or returns nil.
func (w *Worker) claimNext(ctx context.Context) (*claim, Job, error) {
	cur, err := w.jobs.tasks.Find(ctx, bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{taskPending, taskRunning}}}}})
	if err != nil {
		return nil, Job{}, fmt.Errorf("list tasks: %w", mongoerr.Translate(err))
	}
	var open []Task
	if err := cur.All(ctx, &open); err != nil {
		return nil, Job{}, fmt.Errorf("list tasks: %w", mongoerr.Translate(err))
	}
	now := w.jobs.now()
	jobs := map[string]*Job{}
	for _, t := range open {
		if w.isRunning(t.ID) || (t.State == taskRunning && now.Before(t.LeaseUntil)) {
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
				return nil, Job{}, err
			}
			job, jobs[t.Job] = &j, &j
		}
		if job == nil || job.State.Final() || !w.claimable(t, job, now) {
			continue
		}
		c, err := w.jobs.tryClaim(ctx, t, w.cfg.Owner, w.cfg.LeaseTTL)
		if err != nil {
			return nil, Job{}, err
		}
		if c != nil {
			return c, *job, nil
		}
	}
	return nil, Job{}, nil
}

func (w *Worker) isRunning(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running[id]
}

// claimable says whether this worker may take t now (job holds its
// sibling tasks).
func (w *Worker) claimable(t Task, job *Job, now time.Time) bool {
	if job.Kind == KindReplay && w.pub == nil {
		return false
	}
	if job.Projection != "" && w.projs[job.Projection] == nil {
		return false
	}
	if job.Kind != KindRebuild {
		return true
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
		return (final && planned && parts == job.Partitions) || (stop && !live)
	case taskPlan:
		return !stop
	}
	return !stop && !now.Before(job.CreatedAt.Add(w.cfg.Settle))
}

// errJobCanceled: an operator asked the job to stop.
var errJobCanceled = errors.New("job canceled")

// execute runs a claimed task, renewing its lease, and records how it
// ended: done (the task did), canceled, released for a retry, or failed
// after MaxAttempts.
func (w *Worker) execute(ctx context.Context, c *claim, job Job) {
	l := w.l.With("job", job.ID, "kind", job.Kind, "projection", job.Projection, "task", c.task.Name, "epoch", c.task.Epoch)
	if job.Kind == KindRebuild {
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
				if errors.Is(err, errLeaseLost) || !c.valid() {
					cancel(errLeaseLost)
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
	case errors.Is(context.Cause(tctx), errLeaseLost) || errors.Is(err, errLeaseLost):
		l.Warn("task lease lost: it ran out before a renewal got through, or another instance took the task")
	case errors.Is(err, errJobCanceled):
		l.Info("task canceled")
		if job.Kind == KindRebuild && c.task.Name == taskFinish {
			// Canceled during the verify before the switch.
			job.CancelRequested = true
			if err := w.cleanUp(bg, job); err != nil {
				l.Warn("cleaning up the canceled rebuild failed", "err", err)
			}
		} else if job.Kind != KindRebuild {
			_ = w.jobs.finishJob(bg, job.ID, StateCanceled, "", nil)
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
		if job.Kind != KindRebuild || c.task.Name == taskFinish {
			_ = w.jobs.finishJob(bg, job.ID, StateFailed, err.Error(), nil)
			if job.Kind == KindRebuild {
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
	case job.Kind == KindRebuild && c.task.Name == taskPlan:
		if err := w.jobs.plan(ctx, &job); err != nil {
			return err
		}
		return c.finish(ctx, taskDone, "")
	case job.Kind == KindRebuild && c.task.Name == taskFinish:
		return w.finishRebuild(ctx, c, job)
	case job.Kind == KindRebuild:
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
	canceled, err := w.jobs.cancelRequested(ctx, t.Job)
	if err != nil {
		return err
	}
	if canceled {
		return errJobCanceled
	}
	return nil
}

// scan rebuilds one partition into the shadow collection, from the
// task's cursor on, checkpointing after every batch of streams.
func (w *Worker) scan(ctx context.Context, c *claim, job Job) error {
	m := w.projs[job.Projection]
	if err := m.ensureIndexes(ctx, job.Shadow); err != nil {
		return err
	}
	t := c.task
	start, startEvents := time.Now(), t.Events
	// The partition's counts as last checkpointed (c.task), also when
	// the checkpoint found the job canceled.
	record := func() {
		w.cfg.Metrics.rebuildPartition(job.Projection, job.ID, c.task.Name, c.task.Events, c.task.Streams)
	}
	record()
	var batch []domain.StreamEvents
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		res, err := m.writeFolds(ctx, job.Shadow, batch)
		if err != nil {
			return err
		}
		for _, st := range batch {
			t.Commits += int64(st.Commits)
		}
		t.Events += res.Events
		t.Streams += int64(len(batch))
		t.Poison += res.Poison
		t.Cursor = batch[len(batch)-1].StreamID
		batch = batch[:0]
		for _, e := range res.Errors {
			w.l.Warn("rebuild: stream cannot be folded; its good events are kept", "job", job.ID, "err", e)
		}
		err = w.progress(ctx, c, &t)
		record()
		if err != nil {
			return err
		}
		if r := w.cfg.MaxEventsPerSecond; r > 0 {
			due := time.Duration(float64(t.Events-startEvents) / r * float64(time.Second))
			sleep(ctx, due-time.Since(start))
		}
		return ctx.Err()
	}
	err := w.log.Scan(ctx, domain.ScanRange{From: t.From, To: t.To, After: t.Cursor}, func(st domain.StreamEvents) error {
		batch = append(batch, st)
		if len(batch) >= w.cfg.BatchStreams {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}

// finishRebuild ends a rebuild: after a cancel or a failed partition it
// cleans up; otherwise it verifies the shadow against the log, repairing
// what live writes and the scan left behind, and switches the pointer.
// Once the job has recorded the collection the switch replaces, it is
// committed to the switch: a cancel is refused from then on (Jobs.Cancel),
// and one recorded anyway (by an older binary) is ignored, so a finish run
// again after the switch completes the job instead of retiring the
// collection readers read.
func (w *Worker) finishRebuild(ctx context.Context, c *claim, job Job) error {
	cur, err := w.jobs.Get(ctx, job.ID)
	if err != nil {
		return err
	}
	m := w.projs[job.Projection]
	ptr, err := m.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	committed := cur.Replaced != "" || ptr.Active == job.Shadow
	for _, t := range cur.Tasks {
		if !committed && t.Name != taskFinish && t.State == taskFailed {
			// A failed plan or partition.
			if err := w.cleanUp(ctx, cur); err != nil {
				return err
			}
			if err := w.jobs.finishJob(ctx, job.ID, StateFailed, t.Name+": "+t.Error, nil); err != nil {
				return err
			}
			return c.finish(ctx, taskDone, "")
		}
	}
	if cur.CancelRequested && !committed {
		if err := w.cleanUp(ctx, cur); err != nil {
			return err
		}
		return c.finish(ctx, taskDone, "")
	}
	if ptr.Active != job.Shadow {
		// Not switched yet (a retried finish may find it switched).
		t := c.task
		rep, err := m.verify(ctx, job.Shadow, w.log, true, func(p VerifyProgress) error {
			t.Events, t.Streams, t.Cursor = p.Events, p.Streams, p.Cursor
			return w.progress(ctx, c, &t)
		})
		if err != nil {
			return err
		}
		if ptr, err = m.Pointer(ctx, 0); err != nil {
			return err
		}
		if ptr.Shadow != job.Shadow {
			return fmt.Errorf("rebuild %s: the pointer names shadow %q, not %q: %w", job.ID, ptr.Shadow, job.Shadow, ErrPointerMoved)
		}
		// What the switch replaces is saved first, so a finish retried
		// after the switch can still retire it. Saving it commits the
		// job to the switch: filtered on no cancel request, as Cancel is
		// filtered on no replaced collection, so of a cancel and a switch
		// racing exactly one wins.
		cur.Replaced, cur.Report = ptr.Active, &rep
		res, err := w.jobs.jobs.UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}, {Key: "cancel_requested", Value: bson.D{{Key: "$ne", Value: true}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "replaced", Value: cur.Replaced}, {Key: "report", Value: cur.Report}}}})
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", job.ID, mongoerr.Translate(err))
		}
		if res.MatchedCount == 0 && !committed {
			return errJobCanceled // requested since the verify's last checkpoint
		}
		switchedAt := w.jobs.now().UTC()
		_, err = w.jobs.pointers.update(ctx, job.Projection, w.jobs.defs[job.Projection], func(p *Pointer) (bool, error) {
			switch {
			case p.Active == job.Shadow:
				return false, nil // switched by another run of this finish
			case p.Shadow != job.Shadow || p.Active != cur.Replaced:
				return false, fmt.Errorf("rebuild %s: the pointer names %q active and %q shadow, not %q and %q: %w",
					job.ID, p.Active, p.Shadow, cur.Replaced, job.Shadow, ErrPointerMoved)
			case !c.valid():
				return false, errLeaseLost
			}
			p.Active, p.Shadow, p.ShadowJob, p.SwitchedAt = job.Shadow, "", "", switchedAt
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("rebuild %s: switch to %s: %w", job.ID, job.Shadow, err)
		}
		w.l.Info("rebuild switched the read model", "job", job.ID, "projection", job.Projection, "active", job.Shadow,
			"replaced", cur.Replaced, "repaired_before_switch", rep.Repaired)
	}
	if cur.Replaced != "" {
		if err := w.jobs.pointers.retire(ctx, job.Projection, cur.Replaced, "replaced by rebuild "+job.ID, w.jobs.now().Add(w.cfg.Grace)); err != nil {
			return err
		}
	}
	if err := w.jobs.finishJob(ctx, job.ID, StateSucceeded, "", nil); err != nil {
		return err
	}
	if err := w.jobs.unlock(ctx, job.Projection, job.ID); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}

// cleanUp undoes a rebuild that will not finish: the pointer drops its
// shadow (scheduled for dropping after the grace period, since projectors
// may write it until they re-read the pointer), partitions not started are
// canceled, and the lock is released. A canceled job is marked here. A
// shadow the pointer has already made active is left alone: readers read
// it now, and what it replaced is the finish's to retire.
func (w *Worker) cleanUp(ctx context.Context, job Job) error {
	ptr, err := w.jobs.pointers.update(ctx, job.Projection, w.jobs.defs[job.Projection], func(p *Pointer) (bool, error) {
		if p.Shadow != job.Shadow {
			return false, nil
		}
		p.Shadow, p.ShadowJob = "", ""
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("rebuild %s: withdraw %s: %w", job.ID, job.Shadow, err)
	}
	if ptr.Active == job.Shadow {
		w.l.Warn("rebuild not cleaned up: it has switched the read model", "job", job.ID, "projection", job.Projection, "active", job.Shadow)
		return w.jobs.unlock(ctx, job.Projection, job.ID)
	}
	if err := w.jobs.pointers.retire(ctx, job.Projection, job.Shadow, "rebuild "+job.ID+" did not finish", w.jobs.now().Add(w.cfg.Grace)); err != nil {
		return err
	}
	if _, err := w.jobs.tasks.UpdateMany(ctx, bson.D{{Key: "job", Value: job.ID}, {Key: "state", Value: taskPending}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: taskCanceled}}}}); err != nil {
		return fmt.Errorf("cancel tasks of %s: %w", job.ID, mongoerr.Translate(err))
	}
	if job.CancelRequested {
		if err := w.jobs.finishJob(ctx, job.ID, StateCanceled, "", nil); err != nil {
			return err
		}
	}
	return w.jobs.unlock(ctx, job.Projection, job.ID)
}

// verify runs a verify job on the active collection.
func (w *Worker) verify(ctx context.Context, c *claim, job Job) error {
	m := w.projs[job.Projection]
	ptr, err := m.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	t := c.task
	t.Events, t.Streams, t.Cursor = 0, 0, ""
	rep, err := m.verify(ctx, ptr.Active, w.log, job.Repair, func(p VerifyProgress) error {
		t.Events, t.Streams, t.Cursor = p.Events, p.Streams, p.Cursor
		return w.progress(ctx, c, &t)
	})
	if err != nil {
		return err
	}
	if err := w.jobs.finishJob(ctx, job.ID, StateSucceeded, "", &rep); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}

// replay publishes the job's part of the log again, stream by stream,
// checkpointing after every batch.
func (w *Worker) replay(ctx context.Context, c *claim, job Job) error {
	spec := job.Replay
	if spec == nil {
		return fmt.Errorf("replay %s: no range", job.ID)
	}
	t := c.task
	publish := func(evs []domain.Event, streams int, last string) error {
		n, err := w.pub(ctx, evs)
		if err != nil {
			return err
		}
		t.Events += int64(n)
		t.Streams += int64(streams)
		t.Cursor = last
		return w.progress(ctx, c, &t)
	}
	if spec.StreamID != "" {
		evs, err := w.log.Load(ctx, spec.StreamID, 0)
		if err != nil {
			return err
		}
		if err := publish(evs, 1, spec.StreamID); err != nil {
			return err
		}
		return w.finishReplay(ctx, c, job)
	}
	var evs []domain.Event
	streams, last := 0, ""
	err := w.log.Scan(ctx, domain.ScanRange{After: t.Cursor, RecordedFrom: spec.From, RecordedTo: spec.To}, func(st domain.StreamEvents) error {
		if st.Err != nil {
			return fmt.Errorf("replay %s: %w", st.StreamID, st.Err)
		}
		evs = append(evs, st.Events...)
		streams, last = streams+1, st.StreamID
		if len(evs) >= 1000 {
			err := publish(evs, streams, last)
			evs, streams = evs[:0], 0
			return err
		}
		return nil
	})
	if err == nil && streams > 0 {
		err = publish(evs, streams, last)
	}
	if err != nil {
		return err
	}
	return w.finishReplay(ctx, c, job)
}

func (w *Worker) finishReplay(ctx context.Context, c *claim, job Job) error {
	if err := w.jobs.finishJob(ctx, job.ID, StateSucceeded, "", nil); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}

// Status returns each projection's pointer, latest verify and rebuild,
// and dead letters; lag (nil when unknown) and last error come from the
// callers that know them (the projection runners).
func (j *Jobs) Status(ctx context.Context, dead *DeadLetters, lag func(ctx context.Context, name string) (*uint64, string)) ([]ProjectionStatus, error) {
	var out []ProjectionStatus
	for _, name := range j.Projections() {
		ptr, err := j.pointers.Get(ctx, name, j.defs[name], 0)
		if err != nil {
			return nil, err
		}
		st := ProjectionStatus{Name: name, ActiveCollection: ptr.Active, ShadowCollection: ptr.Shadow, Generation: ptr.Generation}
		if lag != nil {
			st.ConsumerLag, st.LastError = lag(ctx, name)
		}
		if dead != nil {
			if st.DeadLetters, err = dead.Count(ctx, name); err != nil {
				return nil, err
			}
		}
		v, err := j.Latest(ctx, name, KindVerify)
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
		r, err := j.Latest(ctx, name, KindRebuild)
		if err != nil {
			return nil, err
		}
		if r != nil {
			st.LastRebuild = &JobSummary{Job: r.ID, State: r.State, Error: r.Error}
			if r.Error != "" && st.LastError == "" {
				st.LastError = "rebuild: " + r.Error
			}
		}
		out = append(out, st)
	}
	return out, nil
}
