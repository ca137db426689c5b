package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projector"
)

// adminAPI is the admin side of the REST API: the repair jobs, the
// projections' state and the dead letters.
type adminAPI struct {
	jobs    *jobs.Jobs
	dead    *projector.DeadLetters
	runners []*projector.Runner
	checks  []readModelCheck
	bus     bool // false on an api-only instance without NATS_URL: no consumer lag to show
}

// readModelCheck is a projection as the order page of the console sees it
// (*projection.Projection).
type readModelCheck interface {
	Check(ctx context.Context, id string) (domain.ReadModelCheck, error)
}

func (a *adminAPI) StartRebuild(ctx context.Context, projection string, partitions int) (domain.Job, error) {
	return a.jobs.StartRebuild(ctx, projection, partitions)
}

func (a *adminAPI) StartVerify(ctx context.Context, projection string, repair bool) (domain.Job, error) {
	return a.jobs.StartVerify(ctx, projection, repair)
}

func (a *adminAPI) StartReplay(ctx context.Context, spec domain.ReplaySpec) (domain.Job, error) {
	return a.jobs.StartReplay(ctx, spec)
}

func (a *adminAPI) Job(ctx context.Context, id string) (domain.Job, error) {
	if err := domain.ValidateID("job id", id); err != nil {
		return domain.Job{}, fmt.Errorf("%v: %w", err, domain.ErrNotFound)
	}
	return a.jobs.Get(ctx, id)
}

func (a *adminAPI) CancelJob(ctx context.Context, id string) (domain.Job, error) {
	if _, err := a.Job(ctx, id); err != nil {
		return domain.Job{}, err
	}
	return a.jobs.Cancel(ctx, id)
}

// Projections adds to each projection's state (jobs.Jobs.Status) its
// partitions: owner and apply rate from the lease documents, lag from
// JetStream.
func (a *adminAPI) Projections(ctx context.Context) ([]domain.ProjectionStatus, error) {
	list, err := a.jobs.Status(ctx, a.dead, func(ctx context.Context, name string) (*uint64, string) {
		r := a.runner(name)
		if r == nil {
			return nil, ""
		}
		if !a.bus {
			return nil, "consumer: unknown, this instance has no NATS_URL"
		}
		n, err := r.Lag(ctx)
		if err != nil {
			return nil, "consumer: " + err.Error()
		}
		return &n, r.LastError()
	})
	if err != nil {
		return nil, err
	}
	for i, p := range list {
		r := a.runner(p.Name)
		if r == nil {
			continue
		}
		if list[i].Partitions, err = r.PartitionStatus(ctx, a.bus); err != nil {
			return nil, err
		}
		if a.bus {
			if n, err := r.AckFloor(ctx); err == nil {
				list[i].AckFloor = &n
			}
		}
	}
	return list, nil
}

func (a *adminAPI) runner(name string) *projector.Runner {
	for _, r := range a.runners {
		if r.Name() == name {
			return r
		}
	}
	return nil
}

func (a *adminAPI) DeadLetters(ctx context.Context, projection string, limit int64) ([]domain.DeadLetter, error) {
	if projection != "" && a.runner(projection) == nil {
		return nil, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	return a.dead.List(ctx, projection, limit)
}

func (a *adminAPI) RetryDeadLetter(ctx context.Context, id string) error {
	name, _, _ := strings.Cut(id, ":")
	r := a.runner(name)
	if r == nil || len(id) > 256 {
		return fmt.Errorf("dead letter %q: %w", id, domain.ErrNotFound)
	}
	return r.Retry(ctx, id)
}

func (a *adminAPI) ReadModels(ctx context.Context, orderID string) ([]domain.ReadModelCheck, error) {
	out := make([]domain.ReadModelCheck, 0, len(a.checks))
	known := false
	for _, p := range a.checks {
		c, err := p.Check(ctx, orderID)
		if err != nil {
			return nil, err
		}
		known = known || c.StoredVersion > 0 || c.LogVersion > 0 || c.State != "equal" || c.FoldError != ""
		out = append(out, c)
	}
	if !known {
		return nil, fmt.Errorf("order %s: %w", orderID, domain.ErrNotFound)
	}
	return out, nil
}
