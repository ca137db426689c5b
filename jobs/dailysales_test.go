package jobs_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
)

// TestDailySalesVerifyAndRebuild repairs daily_sales as the other read
// models: a verify finds a sale deleted and two changed behind the
// service's back (the day and the gross that the sums are made of), a
// rebuild writes a new collection from the log and switches to it, and
// the read model and its sums then equal the fold of the log.
func TestDailySalesVerifyAndRebuild(t *testing.T) {
	ctx, k, f := projectedKit(t, 90*time.Second, "sale", 30, 4)
	db := k.db
	k.worker(t, "w1", jobs.WorkerConfig{})
	name := projection.DailySales.Name
	verify := func(what string) jobs.VerifyReport {
		t.Helper()
		job, err := k.jobs.StartVerify(ctx, name, false)
		if err != nil {
			t.Fatal(err)
		}
		job = k.waitJob(t, ctx, job.ID, 30*time.Second)
		if job.State != jobs.StateSucceeded || job.Report == nil {
			t.Fatalf("%s: verify job %s: %s %s", what, job.ID, job.State, job.Error)
		}
		return *job.Report
	}
	if rep := verify("before any drift"); rep.Drift() != 0 || rep.Digest != rep.ExpectedDigest || rep.Documents != 30 {
		t.Fatalf("verify before any drift: %+v", rep)
	}

	coll := db.Collection(projection.DailySales.Collection)
	projectiontest.Must(t)(coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: f.IDs[4]}}))
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: f.IDs[9]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "day", Value: "1999-01-01"}}}}))
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: f.IDs[11]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "subtotal_cents", Value: 1}}}}))
	if err := projectiontest.DiffDailySales(ctx, db, f); err == nil {
		t.Fatal("the drifted read model equals the fold")
	}
	rep := verify("after the drift")
	if rep.Missing != 1 || rep.Different != 2 || rep.Stale != 0 || rep.Extra != 0 {
		t.Errorf("drift: missing %d different %d stale %d extra %d, want 1 2 0 0", rep.Missing, rep.Different, rep.Stale, rep.Extra)
	}
	for _, e := range rep.Examples {
		if want := map[string][]string{f.IDs[9]: {"day"}, f.IDs[11]: {"subtotal_cents"}}[e.ID]; want != nil && !slices.Equal(e.Fields, want) {
			t.Errorf("different fields of %s: %v, want %v", e.ID, e.Fields, want)
		}
	}

	job, err := k.jobs.StartRebuild(ctx, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 60*time.Second)
	if job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild %s: %s: %s", job.ID, job.State, job.Error)
	}
	ptr, err := k.ps.Get(ctx, name, projection.DailySales.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Active == projection.DailySales.Collection {
		t.Errorf("pointer after the rebuild: %+v, want active %s", ptr, job.Shadow)
	}
	if err := projectiontest.DiffDailySales(ctx, db, f); err != nil {
		t.Error(err)
	}
	if rep := verify("after the rebuild"); rep.Drift() != 0 || rep.Digest != rep.ExpectedDigest {
		t.Errorf("verify after the rebuild: %+v", rep)
	}
}
