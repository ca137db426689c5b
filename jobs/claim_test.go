package jobs_test

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestRenewalOutlivesASlowStore: a claim whose last renewal got through
// too long ago to act on (a loaded store) is renewed while no other runner
// has claimed the task, and may act again; once another runner has
// claimed it after its lease ran out, the renewal answers domain.ErrLeaseLost and
// the task's other writes are refused.
func TestRenewalOutlivesASlowStore(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	es, db := storetest.OpenStore(t)
	ps := mongodb.NewPointers(db)
	j := jobs.New(mongodb.NewJobs(db), ps, es, mongodb.NewProjection(db, projection.OrderSummaries, es, nil, ps))
	job, err := j.StartVerify(ctx, projection.OrderSummaries.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 4 * time.Second
	c, err := j.ClaimOnlyTask(ctx, job.ID, "w1", ttl)
	if err != nil || c == nil {
		t.Fatalf("claim: %v, %v", c, err)
	}

	c.Lapse(ttl)
	if c.Valid() {
		t.Fatal("a claim last renewed a whole lease ago is valid")
	}
	if err := c.Checkpoint(ctx); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("checkpoint of a lapsed claim: %v, want domain.ErrLeaseLost", err)
	}
	if err := c.Renew(ctx); err != nil {
		t.Fatalf("renewal of a lapsed claim that nobody else took: %v", err)
	}
	if !c.Valid() {
		t.Fatal("not valid after a renewal that got through")
	}
	if err := c.Checkpoint(ctx); err != nil {
		t.Fatalf("checkpoint after the renewal: %v", err)
	}

	// The lease runs out and another runner claims the task.
	if _, err := db.Collection(mongodb.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: c.TaskID()}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "lease_until", Value: time.Now().Add(-time.Second).UTC()}}}}); err != nil {
		t.Fatal(err)
	}
	c2, err := j.ClaimOnlyTask(ctx, job.ID, "w2", ttl)
	if err != nil || c2 == nil {
		t.Fatalf("claim by w2 after the lease ran out: %v, %v", c2, err)
	}
	c.Lapse(ttl)
	if err := c.Renew(ctx); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("renewal of w1 after w2 claimed the task: %v, want domain.ErrLeaseLost", err)
	}
	if err := c2.Renew(ctx); err != nil {
		t.Fatalf("renewal of w2: %v", err)
	}
}
