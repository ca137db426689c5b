package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// repairKit is what the repair jobs need on one database.
type repairKit struct {
	db   *mongo.Database
	es   *mongodb.EventStore
	ps   *mongodb.Pointers
	sums *projection.Model[domain.Order]
	stat *projection.Model[projectiontest.Contribution]
	jobs *jobs.Jobs
	// republish is the workers' publisher of replays (nil: they take no
	// replay).
	republish func(context.Context, []domain.Event) (int, error)
}

// newKit appends n orders named prefix000.. for customers cust-0 ..
// cust-(customers-1) to es, the log of db, and returns the repair jobs on
// db with that fixture.
func newKit(t *testing.T, ctx context.Context, es *mongodb.EventStore, db *mongo.Database, prefix string, n, customers int) (*repairKit, *projectiontest.Fixture) {
	t.Helper()
	f := projectiontest.NewFixture(t, ctx, es, prefix, n, customers)
	ps := mongodb.NewPointers(db)
	k := &repairKit{db: db, es: es, ps: ps,
		sums: mongodb.NewProjection(db, projection.OrderSummaries, es, nil, ps),
		stat: mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, ps),
	}
	k.jobs = jobs.New(mongodb.NewJobs(db), ps, es, k.sums, k.stat)
	return k, f
}

// projectedKit is newKit on a new database, under a context canceled
// when the test ends or after limit, with the fold of the fixture written
// into every read model.
func projectedKit(t *testing.T, limit time.Duration, prefix string, n, customers int) (context.Context, *repairKit, *projectiontest.Fixture) {
	t.Helper()
	ctx := projectiontest.Context(t, limit)
	es, db := storetest.OpenStore(t)
	k, f := newKit(t, ctx, es, db, prefix, n, customers)
	k.project(t, ctx, f)
	return ctx, k, f
}

// worker starts a Worker with test timings; it stops with the test.
func (k *repairKit) worker(t *testing.T, owner string, cfg jobs.WorkerConfig) {
	cfg.Owner = owner
	if cfg.Poll == 0 {
		cfg.Poll = 50 * time.Millisecond
	}
	if cfg.Settle == 0 {
		cfg.Settle = 300 * time.Millisecond
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 3 * time.Second
	}
	w := jobs.NewWorker(k.jobs, k.es, k.republish, cfg, projectiontest.Logger(t))
	projectiontest.Go(t, "worker "+owner, w.Run)
}

// waitJob waits until the job is final and returns it.
func (k *repairKit) waitJob(t *testing.T, ctx context.Context, id string, limit time.Duration) jobs.Job {
	t.Helper()
	var job jobs.Job
	projectiontest.WaitFor(t, limit, "job "+id+" final", func() error {
		var err error
		if job, err = k.jobs.Get(ctx, id); err != nil {
			return err
		}
		if !job.State.Final() {
			return fmt.Errorf("state %s, %d streams done", job.State, job.Streams)
		}
		return nil
	})
	return job
}

// project writes the fold of f into every read model's active collection.
func (k *repairKit) project(t *testing.T, ctx context.Context, f *projectiontest.Fixture) {
	t.Helper()
	for _, apply := range []func(context.Context, []domain.Event) (projection.Outcome, map[string]error, error){
		readModel(k.db, projection.OrderSummaries, k.es).Apply,
		readModel(k.db, projectiontest.CustomerTotals, k.es).Apply,
	} {
		if _, poison, err := apply(ctx, f.Flat); err != nil || len(poison) > 0 {
			t.Fatalf("project the fixture: %v %v", err, poison)
		}
	}
}

// readModel is the read model of def in its base collection in db.
func readModel[D any](db *mongo.Database, def projection.Definition[D], events projection.Log) *projection.ReadModel[D] {
	return projection.NewReadModel(def, def.Collection, mongodb.NewDocuments[D](db), events, nil)
}
