package jobs

import (
	"context"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// StartVerify creates a verify job of projection's active collection;
// with repair it rewrites the documents that differ from the fold of the
// log. The log's commits, counted now, are the total its ETA is measured
// against. Errors: domain.ErrNotFound for an unknown projection, the
// store's.
func (j *Jobs) StartVerify(ctx context.Context, projection string, repair bool) (domain.Job, error) {
	if err := j.known(projection); err != nil {
		return domain.Job{}, err
	}
	total, err := j.events.Commits(ctx)
	if err != nil {
		return domain.Job{}, err
	}
	job := domain.Job{ID: newJobID(), Kind: domain.KindVerify, Projection: projection, State: domain.StateQueued, CreatedAt: j.now().UTC(), Repair: repair,
		TotalCommits: total}
	return job, j.create(ctx, job, taskVerify)
}

// verify runs a verify job on the active collection.
func (w *Worker) verify(ctx context.Context, c *claim, job domain.Job) error {
	m := w.projs[job.Projection]
	ptr, err := m.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	t := c.task
	t.Events, t.Streams, t.Commits, t.Cursor = 0, 0, 0, ""
	rep, err := m.Verify(ctx, ptr.Active, w.events, job.Repair, func(p mongodb.VerifyProgress) error {
		t.Events, t.Streams, t.Commits, t.Cursor = p.Events, p.Streams, p.Commits, p.Cursor
		return w.progress(ctx, c, &t)
	})
	if err != nil {
		return err
	}
	if err := w.jobs.finishJob(ctx, job.ID, domain.StateSucceeded, "", &rep); err != nil {
		return err
	}
	return c.finish(ctx, taskDone, "")
}
