package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// TestVerifyReportsAndRepairsExactlyTheDrift alters the summaries behind
// the service's back (two deleted, two changed, one set back a version,
// one added for no stream) and checks that verify reports exactly those,
// that verify with repair fixes exactly those, and that a third verify
// finds no drift and a digest equal to the fold's.
func TestVerifyReportsAndRepairsExactlyTheDrift(t *testing.T) {
	ctx, k, f := projectedKit(t, 90*time.Second, "vfy", 40, 5)
	db := k.db
	k.worker(t, "w1", jobs.WorkerConfig{})

	clean := k.verify(t, ctx, false)
	if clean.Drift() != 0 || clean.Digest != clean.ExpectedDigest || clean.Streams != 40 || clean.Documents != 40 {
		t.Fatalf("verify before any drift: %+v", clean)
	}

	coll := db.Collection(projection.OrderSummaries.Collection)
	del := []string{f.IDs[3], f.IDs[17]}
	changed := []string{f.IDs[5], f.IDs[22]}
	staleID := f.IDs[0] // lifecycle 0 has six events
	for _, id := range del {
		projectiontest.Must(t)(coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}))
	}
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: changed[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 1}}}}))
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: changed[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "customer_id", Value: "someone-else"}}}}))
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: staleID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: 2}, {Key: "status", Value: "approved"}}}}))
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "ghost"}, {Key: "version", Value: 1}, {Key: "status", Value: "created"}}); err != nil {
		t.Fatal(err)
	}

	want := map[string][]string{"missing": del, "different": changed, "stale": {staleID}, "extra": {"ghost"}}
	check := func(rep projection.VerifyReport, what string) {
		t.Helper()
		got := map[string][]string{}
		for _, e := range rep.Examples {
			got[e.Kind] = append(got[e.Kind], e.ID)
		}
		for kind := range got {
			slices.Sort(got[kind])
		}
		for kind, ids := range want {
			ids = slices.Sorted(slices.Values(ids))
			if !slices.Equal(got[kind], ids) {
				t.Errorf("%s: %s documents %v, want %v", what, kind, got[kind], ids)
			}
		}
		if rep.Missing != 2 || rep.Different != 2 || rep.Stale != 1 || rep.Extra != 1 {
			t.Errorf("%s: counts missing %d different %d stale %d extra %d, want 2 2 1 1", what, rep.Missing, rep.Different, rep.Stale, rep.Extra)
		}
		if rep.Digest == rep.ExpectedDigest {
			t.Errorf("%s: the digest of a drifted read model equals the fold's", what)
		}
	}
	found := k.verify(t, ctx, false)
	check(found, "verify")
	if found.Repaired != 0 {
		t.Errorf("verify without repair repaired %d documents", found.Repaired)
	}
	for _, e := range found.Examples {
		if e.ID == changed[0] && !slices.Equal(e.Fields, []string{"total_cents"}) {
			t.Errorf("different fields of %s: %v, want [total_cents]", e.ID, e.Fields)
		}
	}
	// Verify alone changed nothing: the same drift is found again.
	check(k.verify(t, ctx, false), "second verify without repair")

	// Documents not drifted must not be written by the repair.
	untouched := f.IDs[30]
	before := rawDoc(t, ctx, coll, untouched)
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: untouched}}, bson.D{{Key: "$set", Value: bson.D{{Key: "marker", Value: "kept"}}}}))

	repaired := k.verify(t, ctx, true)
	check(repaired, "verify with repair")
	if repaired.Repaired != 6 {
		t.Errorf("repaired %d documents, want 6", repaired.Repaired)
	}
	after := k.verify(t, ctx, false)
	if after.Drift() != 0 || after.Digest != after.ExpectedDigest || after.Digest != clean.Digest {
		t.Errorf("verify after repair: drift %d, digest %s, expected %s, clean digest %s", after.Drift(), after.Digest, after.ExpectedDigest, clean.Digest)
	}
	if got := rawDoc(t, ctx, coll, untouched); got["marker"] != "kept" || got["version"] != before["version"] {
		t.Errorf("an undrifted document was rewritten by the repair: %v", got)
	}
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartVerify(ctx, "no_such_projection", false); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("verify of an unknown projection: %v, want not found", err)
	}
}

func (k *repairKit) verify(t *testing.T, ctx context.Context, repair bool) projection.VerifyReport {
	t.Helper()
	job, err := k.jobs.StartVerify(ctx, projection.OrderSummaries.Name, repair)
	if err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != jobs.StateSucceeded || job.Report == nil {
		t.Fatalf("verify job %s: %s %s", job.ID, job.State, job.Error)
	}
	return *job.Report
}

func rawDoc(t *testing.T, ctx context.Context, coll *mongo.Collection, id string) bson.M {
	t.Helper()
	var m bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&m); err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	return m
}

// TestVerifyRepairStopsWhenItsCollectionIsReplaced: a verify with repair
// whose collection is replaced and dropped by a rebuild between its report
// and its repairs stops with an error and writes nothing, rather than
// recreating the dropped collection with its upserts.
func TestVerifyRepairStopsWhenItsCollectionIsReplaced(t *testing.T) {
	ctx, k, f := projectedKit(t, 60*time.Second, "gone", 12, 3)
	db := k.db
	name, coll := projection.OrderSummaries.Name, projection.OrderSummaries.Collection
	// Drift to repair: two summaries missing.
	projectiontest.Must(t)(db.Collection(coll).DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{f.IDs[2], f.IDs[7]}}}}}))

	// The repairs read the log (the recheck of each suspect) after the
	// report: that is when another rebuild switches the projection to its
	// collection and the replaced one is dropped.
	next := coll + "_next"
	var once sync.Once
	hooked := &hookedLog{EventStore: k.es, before: func() {
		once.Do(func() {
			projectiontest.Must(t)(db.Collection(mongodb.PointersCollection).ReplaceOne(ctx, bson.D{{Key: "_id", Value: name}},
				bson.D{{Key: "_id", Value: name}, {Key: "active", Value: next}, {Key: "generation", Value: int64(7)}},
				options.Replace().SetUpsert(true)))
			if err := db.Collection(coll).Drop(ctx); err != nil {
				t.Error(err)
			}
		})
	}}
	k.sums = mongodb.NewProjection(db, projection.OrderSummaries, hooked, nil, k.ps)
	k.jobs = jobs.New(mongodb.NewJobs(db), k.ps, k.es, k.sums, k.stat)
	k.worker(t, "w1", jobs.WorkerConfig{MaxAttempts: 1})
	job, err := k.jobs.StartVerify(ctx, name, true)
	if err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != jobs.StateFailed || !strings.Contains(job.Error, domain.ErrPointerMoved.Error()) {
		t.Errorf("verify whose collection was dropped before its repairs: %s %q, want failed as the pointer moved", job.State, job.Error)
	}
	// Neither may exist as a collection.
	names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$in", Value: bson.A{coll, next}}}}, {Key: "type", Value: "collection"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) > 0 {
		t.Errorf("collections %v exist after the verify: its repairs recreated a dropped collection", names)
	}
}

// hookedLog is the event store with before called ahead of every
// LoadFrom.
type hookedLog struct {
	*mongodb.EventStore
	before func()
}

func (h *hookedLog) LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error) {
	h.before()
	return h.EventStore.LoadFrom(ctx, streamID, from)
}

// TestTaskClaimedByExactlyOneWorker runs eight workers on one verify job:
// its task is claimed once, by one of them (invariant 6).
func TestTaskClaimedByExactlyOneWorker(t *testing.T) {
	ctx, k, _ := projectedKit(t, 60*time.Second, "clm", 10, 2)
	job, err := k.jobs.StartVerify(ctx, projection.OrderSummaries.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		k.worker(t, fmt.Sprintf("w%d", i), jobs.WorkerConfig{Poll: 5 * time.Millisecond})
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != jobs.StateSucceeded || len(job.Tasks) != 1 || job.Tasks[0].Attempts != 1 {
		t.Fatalf("job %s: %+v", job.State, job.Tasks)
	}
	if task := job.Tasks[0]; task.Epoch != 1 {
		t.Errorf("task at epoch %d, want 1: one claim", task.Epoch)
	}
}

// TestVerifyProgressHasAnETA: a verify knows the log's commits from its
// start and counts the commits it has read, so a running verify has a rate
// and an ETA, as a rebuild's scan has (what orderd verify -wait shows),
// and a finished one has read every commit once.
func TestVerifyProgressHasAnETA(t *testing.T) {
	ctx, k, f := projectedKit(t, 60*time.Second, "eta", 12, 3)
	total, err := k.es.Commits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	job, err := k.jobs.StartVerify(ctx, projection.OrderSummaries.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	// As a runner that died a quarter through the log, 10 s after its
	// start, left it.
	done, started := total/4, time.Now().Add(-10*time.Second)
	projectiontest.Must(t)(k.db.Collection(mongodb.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID + "/verify"}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "state", Value: "running"}, {Key: "owner", Value: "dead"}, {Key: "epoch", Value: 1}, {Key: "attempts", Value: 1},
		{Key: "lease_until", Value: time.Now().Add(-time.Second)}, {Key: "started_at", Value: started},
		{Key: "commits", Value: done}, {Key: "events", Value: done}, {Key: "streams", Value: 1},
	}}}))
	running, err := k.jobs.Get(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	secs := time.Since(started).Seconds()
	want := float64(total-done) / (float64(done) / secs)
	if running.State != jobs.StateRunning || running.RatePerSecond <= 0 || running.ETASeconds < 0.9*want || running.ETASeconds > 1.1*want {
		t.Errorf("verify %d of %d commits after %.0f s: %s, %.1f events/s, ETA %.1f s, want about %.1f s",
			done, total, secs, running.State, running.RatePerSecond, running.ETASeconds, want)
	}

	k.worker(t, "w1", jobs.WorkerConfig{})
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	v, _ := job.Task("verify")
	if job.State != jobs.StateSucceeded || v.Commits != total || v.Events != int64(len(f.Flat)) || job.ETASeconds != 0 {
		t.Errorf("verify done: %s, read %d commits and %d events (want %d and %d), ETA %.1f s",
			job.State, v.Commits, v.Events, total, len(f.Flat), job.ETASeconds)
	}
}
