package jobs

import (
	"context"
	"fmt"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// StartVerify creates a verify job of projection's active collection;
// with repair it rewrites the documents that differ from the fold of the
// log. Only the version of the definition the active collection holds
// can check it. The log's commits, counted now, are the total its ETA is
// measured against. Errors: domain.ErrNotFound for an unknown projection,
// domain.ErrNotBuilt before its first build, domain.ErrOtherVersion when
// the active collection is of another version than this process
// folds, domain.ErrJobRunning (wrapped) while a rollup's rebuild runs (its
// verify is a build), domain.ErrUnavailable.
func (j *Jobs) StartVerify(ctx context.Context, projection string, repair bool) (Job, error) {
	if err := j.known(projection); err != nil {
		return Job{}, err
	}
	p := j.projs[projection]
	ptr, err := j.pointers.Get(ctx, projection, p.Collection(), 0)
	if err != nil {
		return Job{}, err
	}
	if err := activeIs(ptr, p.Version()); err != nil {
		return Job{}, err
	}
	if _, compared := p.(comparer); compared {
		// Built again in a shadow and compared with the active
		// collection by the finish; with repair, switched to.
		return j.createRebuild(ctx, Job{Kind: KindVerify, Projection: projection, Partitions: 1, Repair: repair})
	}
	total, err := j.events.Commits(ctx)
	if err != nil {
		return Job{}, err
	}
	job := Job{ID: newJobID(), Kind: KindVerify, Projection: projection, Version: p.Version(), State: StateQueued,
		CreatedAt: j.now().UTC(), Repair: repair, TotalCommits: total}
	return job, j.create(ctx, job, taskVerify)
}

// activeIs checks that ptr's active collection is of version v. Errors:
// domain.ErrNotBuilt, domain.ErrOtherVersion.
func activeIs(ptr projection.Pointer, v int) error {
	if ptr.Generation == 0 {
		return nil // no pointer document: the base collection, of any version
	}
	switch ptr.ActiveVer() {
	case 0:
		return fmt.Errorf("%s: %w", ptr.Projection, domain.ErrNotBuilt)
	case v:
		return nil
	}
	return fmt.Errorf("%s: the active collection is of version %d, this instance folds version %d: %w",
		ptr.Projection, ptr.ActiveVer(), v, domain.ErrOtherVersion)
}

// verify runs a verify job on the active collection.
func (w *Worker) verify(ctx context.Context, c *claim, job Job) error {
	m, ok := w.jobs.projs[job.Projection].(folder)
	if !ok {
		return fmt.Errorf("verify %s: %s is verified by a build: %w", job.ID, job.Projection, domain.ErrValidation)
	}
	ptr, err := w.jobs.pointers.Get(ctx, job.Projection, m.Collection(), 0)
	if err != nil {
		return err
	}
	if err := activeIs(ptr, max(job.Version, 1)); err != nil {
		// Switched to another version since the job was asked for.
		return w.end(ctx, c, job.ID, StateFailed, err.Error(), nil)
	}
	t := c.task
	rep, err := m.Verify(ctx, ptr.Active, w.events, job.Repair, func(p projection.VerifyProgress) error {
		t.Events, t.Streams, t.Commits, t.Cursor = p.Events, p.Streams, p.Commits, p.Cursor
		return w.progress(ctx, c, &t)
	})
	if err != nil {
		return err
	}
	return w.end(ctx, c, job.ID, StateSucceeded, "", &rep)
}

// end records a job's final state, error and report, then its task as
// done.
func (w *Worker) end(ctx context.Context, c *claim, job string, state JobState, errMsg string, rep *projection.VerifyReport) error {
	if err := w.jobs.store.FinishJob(ctx, job, state, errMsg, rep); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}
