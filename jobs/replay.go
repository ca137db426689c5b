package jobs

import (
	"context"
	"fmt"

	"github.com/orderd/orderd/domain"
)

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

// replay publishes the job's part of the log again, stream by stream,
// checkpointing after every batch.
func (w *Worker) replay(ctx context.Context, c *claim, job Job) error {
	spec := job.Replay
	if spec == nil {
		return fmt.Errorf("replay %s: no range", job.ID)
	}
	t := c.task
	var evs []domain.Event
	streams := 0 // of evs, the last of them t.Cursor
	publish := func() error {
		n, err := w.pub(ctx, evs)
		if err != nil {
			return err
		}
		t.Events += int64(n)
		t.Streams += int64(streams)
		evs, streams = evs[:0], 0
		return w.progress(ctx, c, &t)
	}
	var err error
	if spec.StreamID != "" {
		if evs, err = w.events.Load(ctx, spec.StreamID, 0); err == nil {
			streams, t.Cursor = 1, spec.StreamID
			err = publish()
		}
	} else {
		err = w.events.Scan(ctx, domain.ScanRange{After: t.Cursor, RecordedFrom: spec.From, RecordedTo: spec.To}, func(st domain.StreamEvents) error {
			if st.Err != nil {
				return fmt.Errorf("replay %s: %w", st.StreamID, st.Err)
			}
			evs = append(evs, st.Events...)
			streams, t.Cursor = streams+1, st.StreamID
			if len(evs) >= 1000 {
				return publish()
			}
			return nil
		})
		if err == nil && streams > 0 {
			err = publish()
		}
	}
	if err != nil {
		return err
	}
	return w.end(ctx, c, job.ID, StateSucceeded, "", nil)
}
