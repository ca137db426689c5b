package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
	"github.com/orderd/orderd/projection"
)

// StartRebuild creates a rebuild job of projection split into partitions
// (1 to MaxPartitions), building the version of its definition this
// process folds, and announces its shadow collection, which live
// projectors of that version then also write. Errors: domain.ErrNotFound
// for an unknown projection, domain.ErrValidation for a bad partition
// count, domain.ErrOtherVersion when the store's active version is newer
// than this process's, domain.ErrJobRunning (wrapped, with the running
// job's id) while another rebuild of the projection is not finished.
func (j *Jobs) StartRebuild(ctx context.Context, projection string, partitions int) (Job, error) {
	if err := j.known(projection); err != nil {
		return Job{}, err
	}
	if partitions < 1 || partitions > MaxPartitions {
		return Job{}, fmt.Errorf("partitions %d: must be 1 to %d: %w", partitions, MaxPartitions, domain.ErrValidation)
	}
	p := j.projs[projection]
	ptr, err := j.pointers.Get(ctx, projection, p.Collection(), 0)
	if err != nil {
		return Job{}, err
	}
	if ptr.ActiveVer() > p.Version() {
		return Job{}, fmt.Errorf("%s: the store is at version %d, this instance folds version %d: %w",
			projection, ptr.ActiveVer(), p.Version(), domain.ErrOtherVersion)
	}
	return j.createRebuild(ctx, Job{Kind: KindRebuild, Projection: projection, Partitions: partitions})
}

// createRebuild takes the projection's rebuild lock and creates job (its
// Kind, Projection, Partitions and Repair set), which builds a shadow
// collection: a rebuild, or the verify of a rollup (a comparer).
// Errors: domain.ErrJobRunning (wrapped) while another rebuild holds the
// lock, the store's.
func (j *Jobs) createRebuild(ctx context.Context, job Job) (Job, error) {
	job.ID = newJobID()
	if err := j.store.Lock(ctx, job.Projection, job.ID); err != nil {
		return Job{}, err
	}
	created, err := j.createLocked(ctx, job)
	if err != nil {
		_ = j.store.Unlock(context.WithoutCancel(ctx), job.Projection, job.ID)
	}
	return created, err
}

func (j *Jobs) createLocked(ctx context.Context, job Job) (Job, error) {
	now := j.now().UTC()
	id, name := job.ID, job.Projection
	coll := j.projs[name].Collection()
	job.Version, job.State, job.CreatedAt = j.projs[name].Version(), StateQueued, now
	job.Shadow = projection.VersionKey(coll, job.Version) + "_" + strings.ReplaceAll(id, "-", "")
	// Its scan records the sums of what it writes beside the shadow, in
	// projection.SumsCollection(job.Shadow), which is dropped with the job.
	// The partitions are cut by the plan task, off the request path:
	// cutting the log reads every commit id.
	tasks := []Task{
		{ID: id + "/" + taskPlan, Job: id, Name: taskPlan, State: taskPending},
		{ID: id + "/" + taskFinish, Job: id, Name: taskFinish, State: taskPending},
	}
	if err := j.store.InsertTasks(ctx, tasks); err != nil {
		return Job{}, fmt.Errorf("rebuild %s: %w", name, err)
	}
	// Announce the shadow before the job exists: every scan starts after
	// it, and a projector batch that ran across it writes the shadow too
	// (projection.ApplyAll), so every event is in the scan or the shadow.
	_, err := j.pointers.Update(ctx, name, coll, func(p *projection.Pointer) (bool, error) {
		if p.Shadow != "" {
			// Left by a rebuild that died before it finished. Retired
			// first, so a crash here cannot leak it; the drop skips any
			// collection a pointer names.
			if err := j.retireShadow(ctx, name, p.Shadow, "an abandoned shadow", now.Add(abandonedShadowGrace)); err != nil {
				return false, err
			}
		}
		if p.Generation == 0 {
			// No pointer document yet: the base collection is taken to
			// be of this version, as every process wrote it.
			p.ActiveVersion = job.Version
		}
		p.Shadow, p.ShadowJob, p.ShadowVersion = job.Shadow, id, job.Version
		return true, nil
	})
	if err != nil {
		return Job{}, fmt.Errorf("rebuild %s: announce %s: %w", name, job.Shadow, err)
	}
	if err := j.store.InsertJob(ctx, job); err != nil {
		// Take the announcement back, or projectors would write a shadow
		// no job will finish.
		_, perr := j.withdraw(context.WithoutCancel(ctx), job)
		return Job{}, errors.Join(fmt.Errorf("rebuild %s: %w", name, err), perr)
	}
	j.wake()
	return job, nil
}

// plan cuts a rebuild's log into its partitions and creates their tasks.
// It is idempotent: the cut is saved in the job first, and tasks that
// already exist are kept, so a plan resumed after a crash creates the
// same partitions.
func (j *Jobs) plan(ctx context.Context, job *Job) error {
	if job.Bounds == nil {
		// One partition needs no cut: it can start while the log is
		// counted for the ETA.
		job.Bounds = []string{}
		if job.Partitions > 1 {
			bounds, total, err := j.events.Bounds(ctx, job.Partitions)
			if err != nil {
				return err
			}
			job.Bounds, job.TotalCommits = bounds, total
		}
		job.Partitions = len(job.Bounds) + 1
		if err := j.store.SavePlan(ctx, *job); err != nil {
			return err
		}
	}
	edges := append(append([]string{""}, job.Bounds...), "")
	var parts []Task
	for i := 0; i+1 < len(edges); i++ {
		name := "part-" + strconv.Itoa(i)
		parts = append(parts, Task{ID: job.ID + "/" + name, Job: job.ID, Name: name, From: edges[i], To: edges[i+1], State: taskPending})
	}
	if err := j.store.InsertTasks(ctx, parts); err != nil {
		return fmt.Errorf("plan %s: %w", job.ID, err)
	}
	if job.TotalCommits == 0 {
		total, err := j.events.Commits(ctx)
		if err != nil {
			return err
		}
		job.TotalCommits = total
		return j.store.SavePlan(ctx, *job)
	}
	return nil
}

// scan rebuilds one partition into the shadow collection, from the
// task's cursor on, checkpointing after every batch of streams.
func (w *Worker) scan(ctx context.Context, c *claim, job Job) error {
	m := w.jobs.projs[job.Projection]
	// The shadow, announced by now, among them.
	if err := m.EnsureIndexes(ctx); err != nil {
		return err
	}
	if s, ok := m.(starter); ok {
		after, err := s.Prepare(ctx, job.Shadow)
		if err != nil {
			return err
		}
		if pause.For(ctx, time.Until(after)); ctx.Err() != nil {
			return ctx.Err()
		}
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
		res, err := m.WriteFolds(ctx, job.Shadow, batch)
		if err != nil {
			return err
		}
		for _, st := range batch {
			t.Commits += int64(st.Commits)
		}
		t.Events += res.Events
		t.Streams += int64(len(batch))
		t.Summed += int64(len(batch))
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
			pause.For(ctx, due-time.Since(start))
		}
		return ctx.Err()
	}
	err := w.events.Scan(ctx, domain.ScanRange{From: t.From, To: t.To, After: t.Cursor}, func(st domain.StreamEvents) error {
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
// cleans up; otherwise it verifies the shadow against the sums its scan
// recorded (against the log when a partition recorded none), repairing
// what live writes and the scan left behind, switches the pointer and
// drops the sums.
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
	m := w.jobs.projs[job.Projection]
	ptr, err := w.jobs.pointers.Get(ctx, job.Projection, m.Collection(), 0)
	if err != nil {
		return err
	}
	committed := cur.Replaced != "" || ptr.Active == job.Shadow
	if max(job.Version, 1) != m.Version() && (committed || !cur.CancelRequested) {
		return fmt.Errorf("rebuild %s of version %d: a worker of version %d runs only its clean-up after a cancel", job.ID, max(job.Version, 1), m.Version())
	}
	for _, t := range cur.Tasks {
		if !committed && t.Name != taskFinish && t.State == taskFailed {
			// A failed plan or partition.
			if err := w.cleanUp(ctx, cur); err != nil {
				return err
			}
			return w.end(ctx, c, job.ID, StateFailed, t.Name+": "+t.Error, nil)
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
		progress := func(p projection.VerifyProgress) error {
			t.Events, t.Streams, t.Cursor = p.Events, p.Streams, p.Cursor
			return w.progress(ctx, c, &t)
		}
		var rep projection.VerifyReport
		if f, ok := m.(folder); ok && !summed(cur) {
			w.l.Info("rebuild verifies its shadow against the whole log: part of the scan recorded no sums", "job", job.ID, "projection", job.Projection)
			rep, err = f.Verify(ctx, job.Shadow, w.events, true, progress)
		} else {
			// The scan recorded what it wrote (a rollup's scan, in every
			// binary that has rollups): the shadow is checked against
			// that, and only what differs against the log. The scan's
			// counts include the streams that left no document.
			rep, err = m.VerifySums(ctx, job.Shadow, true, progress)
			rep.Events, rep.PoisonStreams = cur.Events, cur.PoisonStreams
		}
		if err != nil {
			return err
		}
		if ptr, err = w.jobs.pointers.Get(ctx, job.Projection, m.Collection(), 0); err != nil {
			return err
		}
		if ptr.Shadow != job.Shadow {
			return fmt.Errorf("rebuild %s: the pointer names shadow %q, not %q: %w", job.ID, ptr.Shadow, job.Shadow, domain.ErrPointerMoved)
		}
		if job.Kind == KindVerify {
			// A rollup's verify: the shadow built again is what the log
			// says; the active collection is compared with it and, with
			// repair, replaced by it where they differ.
			if rep, err = m.(comparer).Compare(ctx, job.Shadow, ptr.Active); err != nil {
				return err
			}
			if !job.Repair || rep.Drift() == 0 {
				// Switched to nothing: the shadow goes.
				if err := w.cleanUp(ctx, cur); err != nil {
					return err
				}
				return w.end(ctx, c, job.ID, StateSucceeded, "", &rep)
			}
			rep.Repaired = rep.Drift()
		}
		// What the switch replaces is saved first, so a finish retried
		// after the switch can still retire it. Saving it commits the
		// job to the switch: filtered on no cancel request, as Cancel is
		// filtered on no replaced collection, so of a cancel and a switch
		// racing exactly one wins.
		cur.Replaced, cur.Report = cmp.Or(ptr.Active, nothingReplaced), &rep
		recorded, err := w.jobs.store.CommitSwitch(ctx, job.ID, cur.Replaced, cur.Report)
		if err != nil {
			return err
		}
		if !recorded && !committed {
			return errJobCanceled // requested since the verify's last checkpoint
		}
		switchedAt := w.jobs.now().UTC()
		_, err = w.jobs.pointers.Update(ctx, job.Projection, m.Collection(), func(p *projection.Pointer) (bool, error) {
			switch {
			case p.Active == job.Shadow:
				return false, nil // switched by another run of this finish
			case p.Shadow != job.Shadow || cmp.Or(p.Active, nothingReplaced) != cur.Replaced:
				return false, fmt.Errorf("rebuild %s: the pointer names %q active and %q shadow, not %q and %q: %w",
					job.ID, p.Active, p.Shadow, cur.Replaced, job.Shadow, domain.ErrPointerMoved)
			case !c.valid():
				return false, domain.ErrLeaseLost
			}
			// What readers read until now stays, fed by the projectors of
			// its version, for a switch back until its grace is over.
			p.Previous, p.PreviousVersion = p.Active, p.ActiveVer()
			p.Active, p.ActiveVersion = job.Shadow, max(job.Version, 1)
			p.Shadow, p.ShadowJob, p.ShadowVersion, p.SwitchedAt = "", "", 0, switchedAt
			p.Broken = "" // of the collection replaced
			if p.SwitchedBackFrom <= p.ActiveVersion {
				p.SwitchedBackFrom = 0
			}
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("rebuild %s: switch to %s: %w", job.ID, job.Shadow, err)
		}
		w.l.Info("rebuild switched the read model", "job", job.ID, "projection", job.Projection, "version", max(job.Version, 1),
			"active", job.Shadow, "replaced", cur.Replaced, "repaired_before_switch", rep.Repaired)
	}
	if cur.Replaced != "" && cur.Replaced != nothingReplaced {
		if err := w.jobs.pointers.Retire(ctx, job.Projection, cur.Replaced, "replaced by rebuild "+job.ID, w.jobs.now().Add(w.cfg.Grace)); err != nil {
			return err
		}
	}
	if err := w.dropSums(ctx, job); err != nil {
		return err
	}
	if err := w.jobs.store.FinishJob(ctx, job.ID, StateSucceeded, "", nil); err != nil {
		return err
	}
	if err := w.jobs.store.Unlock(ctx, job.Projection, job.ID); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}

// summed reports whether every partition of a rebuild recorded the sums
// of all the streams it scanned, so that its finish may verify the shadow
// against them (Projection.VerifySums) rather than the whole log. A
// partition scanned, in whole or in part, by a binary that records no
// sums (a job of an older binary, or a rolling upgrade) counts fewer
// streams summed than scanned. VerifySums would recheck each of its
// documents on its own, correct but a read and a load of the stream per
// document, more than a scan of the log; and a stream whose document
// went missing would have no sum to show it. Such a rebuild is verified
// against the log, as before sums were recorded.
func summed(job Job) bool {
	for _, t := range job.Tasks {
		if t.Name != taskPlan && t.Name != taskFinish && t.Summed != t.Streams {
			return false
		}
	}
	return true
}

// dropSums drops the sums a rebuild's scan recorded: they serve only its
// finish's verify. They are put on the drop list first, for the grace
// period, so that neither a crash before the drop nor a batch a deposed
// scan owner writes after it can leave them behind.
func (w *Worker) dropSums(ctx context.Context, job Job) error {
	sums := projection.SumsCollection(job.Shadow)
	if err := w.jobs.pointers.Retire(ctx, job.Projection, sums, "sums of rebuild "+job.ID, w.jobs.now().Add(w.cfg.Grace)); err != nil {
		return err
	}
	return w.jobs.pointers.Drop(ctx, sums)
}

// nothingReplaced is recorded as the collection a switch replaces when
// readers read none before it (the first build of a projection).
const nothingReplaced = "(none)"

// abandonedShadowGrace is how long the shadow of a rebuild that died stays
// after a new rebuild replaced it: projectors keep writing a shadow until
// they re-read the pointer (within a batch), and a write after the drop
// would re-create the collection where no pointer names it.
const abandonedShadowGrace = time.Minute

// cleanUp undoes a rebuild that will not finish: the pointer drops its
// shadow (scheduled for dropping after the grace period, since projectors
// may write it until they re-read the pointer), partitions not started are
// canceled, and the lock is released. A canceled job is marked here. A
// shadow the pointer has already made active is left alone: readers read
// it now, and what it replaced is the finish's to retire.
func (w *Worker) cleanUp(ctx context.Context, job Job) error {
	ptr, err := w.jobs.withdraw(ctx, job)
	if err != nil {
		return fmt.Errorf("rebuild %s: withdraw %s: %w", job.ID, job.Shadow, err)
	}
	if ptr.Active == job.Shadow {
		w.l.Warn("rebuild not cleaned up: it has switched the read model", "job", job.ID, "projection", job.Projection, "active", job.Shadow)
		return w.jobs.store.Unlock(ctx, job.Projection, job.ID)
	}
	// Its scan may still write the sums until it reaches a checkpoint.
	if err := w.jobs.retireShadow(ctx, job.Projection, job.Shadow, "the shadow of rebuild "+job.ID+", which did not finish", w.jobs.now().Add(w.cfg.Grace)); err != nil {
		return err
	}
	if err := w.jobs.store.SetTasksState(ctx, job.ID, taskPending, taskCanceled); err != nil {
		return err
	}
	if job.CancelRequested {
		if err := w.jobs.store.FinishJob(ctx, job.ID, StateCanceled, "", nil); err != nil {
			return err
		}
	}
	return w.jobs.store.Unlock(ctx, job.Projection, job.ID)
}

// withdraw takes job's shadow off its projection's pointer, if the
// pointer still names it, and returns the pointer.
func (j *Jobs) withdraw(ctx context.Context, job Job) (projection.Pointer, error) {
	return j.pointers.Update(ctx, job.Projection, j.projs[job.Projection].Collection(), func(p *projection.Pointer) (bool, error) {
		if p.Shadow != job.Shadow {
			return false, nil
		}
		p.Shadow, p.ShadowJob, p.ShadowVersion = "", "", 0
		return true, nil
	})
}

// retireShadow schedules the drop of shadow, which is what (a reason the
// drop list shows), and of the sums recorded beside it, at after.
func (j *Jobs) retireShadow(ctx context.Context, name, shadow, what string, after time.Time) error {
	if err := j.pointers.Retire(ctx, name, shadow, what, after); err != nil {
		return err
	}
	return j.pointers.Retire(ctx, name, projection.SumsCollection(shadow), "the sums of "+what, after)
}
