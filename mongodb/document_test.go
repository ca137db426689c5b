package mongodb_test

import (
	"github.com/orderd/orderd/projection"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projector"
)

// The stored shape of jobs, tasks and dead letters is the adapter's
// contract with the documents already in a database and with everyone
// who reads or updates them by field name (filters, $set, the operator's
// queries): each test writes a fully populated value through the adapter,
// reads the raw document back and compares it with the document as it
// has always been stored, then reads the value back through the adapter.
// The fields Jobs.Get fills in from the tasks are set too, to show they
// are not stored.

var (
	created  = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	finished = time.Date(2026, 3, 1, 10, 5, 30, 250_000_000, time.UTC)
)

func TestJobDocument(t *testing.T) {
	ctx := t.Context()
	db := storetest.Database(t)
	store := mongodb.NewJobs(db)
	job := jobs.Job{
		ID: "job-1", Kind: jobs.KindRebuild, Projection: "order_summaries", State: jobs.StateSucceeded,
		CreatedAt: created, FinishedAt: finished, Error: "partial", Partitions: 3,
		Shadow: "order_summaries_v2", Replaced: "order_summaries_v1", Repair: true,
		Replay:       &jobs.ReplaySpec{StreamID: "ord-1", From: created, To: finished},
		TotalCommits: 1200, Bounds: []string{"ord-4", "ord-8"},
		Report: &projection.VerifyReport{Collection: "order_summaries_v2", Streams: 10, Events: 40, Documents: 11,
			Missing: 1, Stale: 2, Extra: 3, Different: 4, Repaired: 5, PoisonStreams: 6,
			Examples: []projection.DriftExample{{ID: "ord-3", Kind: "different", StoredVersion: 2, LogVersion: 2, Fields: []string{"status"}}},
			Digest:   "ab12", ExpectedDigest: "cd34"},
		CancelRequested: true,
		StartedAt:       created, Events: 40, Streams: 10, PoisonStreams: 6, RatePerSecond: 8.5, ETASeconds: 3,
		Tasks: []jobs.Task{{ID: "job-1/plan", Job: "job-1", Name: "plan", State: "done"}},
	}
	if err := store.InsertJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	want := bson.M{
		"_id": "job-1", "kind": "rebuild", "projection": "order_summaries", "state": "succeeded",
		"created_at": created, "finished_at": finished, "error": "partial", "partitions": int32(3),
		"shadow": "order_summaries_v2", "replaced": "order_summaries_v1", "repair": true,
		"replay":        bson.M{"stream_id": "ord-1", "from": created, "to": finished},
		"total_commits": int64(1200), "bounds": bson.A{"ord-4", "ord-8"},
		"report": bson.M{"collection": "order_summaries_v2", "streams": int64(10), "events": int64(40),
			"documents": int64(11), "missing": int64(1), "stale": int64(2), "extra": int64(3), "different": int64(4),
			"repaired": int64(5), "poison_streams": int64(6),
			"examples": bson.A{bson.M{"id": "ord-3", "kind": "different", "stored_version": int64(2), "log_version": int64(2),
				"fields": bson.A{"status"}}},
			"digest": "ab12", "expected_digest": "cd34"},
		"cancel_requested": true,
	}
	assertDocument(t, db.Collection(mongodb.JobsCollection), job.ID, want)

	got, err := store.Job(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	stored := job
	stored.StartedAt, stored.Events, stored.Streams, stored.PoisonStreams = time.Time{}, 0, 0, 0
	stored.RatePerSecond, stored.ETASeconds, stored.Tasks = 0, 0, nil
	if !reflect.DeepEqual(got, stored) {
		t.Errorf("job read back:\n%+v\nwant\n%+v", got, stored)
	}
}

// A job as created, before its plan, finish or report: the optional
// fields are not stored, and read back as the zero values they were.
func TestJobDocumentQueued(t *testing.T) {
	ctx := t.Context()
	db := storetest.Database(t)
	store := mongodb.NewJobs(db)
	job := jobs.Job{ID: "job-2", Kind: jobs.KindVerify, State: jobs.StateQueued, CreatedAt: created}
	if err := store.InsertJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	assertDocument(t, db.Collection(mongodb.JobsCollection), job.ID, bson.M{
		"_id": "job-2", "kind": "verify", "state": "queued", "created_at": created, "total_commits": int64(0)})
	got, err := store.Job(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, job) {
		t.Errorf("job read back:\n%+v\nwant\n%+v", got, job)
	}
}

func TestTaskDocument(t *testing.T) {
	ctx := t.Context()
	db := storetest.Database(t)
	store := mongodb.NewJobs(db)
	task := jobs.Task{
		ID: "job-1/part-1", Job: "job-1", Name: "part-1", From: "ord-4", To: "ord-8", State: "running",
		Owner: "instance-a", Epoch: 3, LeaseUntil: finished, Attempts: 2, Cursor: "ord-6",
		Events: 40, Streams: 10, Commits: 41, Poison: 1, Summed: 9,
		Resumes:   []jobs.Resume{{At: finished, Owner: "instance-a", Cursor: "ord-5", Events: 20, Streams: 5}},
		StartedAt: created, FinishedAt: finished, Error: "lease lost",
	}
	if err := store.InsertTasks(ctx, []jobs.Task{task}); err != nil {
		t.Fatal(err)
	}
	assertDocument(t, db.Collection(mongodb.TasksCollection), task.ID, bson.M{
		"_id": "job-1/part-1", "job": "job-1", "name": "part-1", "from": "ord-4", "to": "ord-8", "state": "running",
		"owner": "instance-a", "epoch": int64(3), "lease_until": finished, "attempts": int32(2), "cursor": "ord-6",
		"events": int64(40), "streams": int64(10), "commits": int64(41), "poison": int64(1), "summed": int64(9),
		"resumes":    bson.A{bson.M{"at": finished, "owner": "instance-a", "cursor": "ord-5", "events": int64(20), "streams": int64(5)}},
		"started_at": created, "finished_at": finished, "error": "lease lost",
	})
	got, err := store.Tasks(ctx, task.Job)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], task) {
		t.Errorf("tasks read back:\n%+v\nwant\n%+v", got, task)
	}
}

func TestDeadLetterDocument(t *testing.T) {
	ctx := t.Context()
	db := storetest.Database(t)
	dead := mongodb.NewDeadLetters(db)
	d := projector.DeadLetter{
		ID: "order_summaries:ev-1", Projection: "order_summaries", StreamID: "ord-1", EventID: "ev-1", Version: 3,
		Subject: "orders.ord-1", Payload: `{"type":"OrderPlaced"}`, Error: "decode: unknown type", Deliveries: 5,
		ParkedAt: created, StreamSeq: 77, RetriedAt: finished, RetryResult: "still fails",
	}
	if err := dead.Park(ctx, d); err != nil {
		t.Fatal(err)
	}
	assertDocument(t, db.Collection(mongodb.DeadLettersCollection), d.ID, bson.M{
		"_id": "order_summaries:ev-1", "projection": "order_summaries", "stream_id": "ord-1", "event_id": "ev-1",
		"version": int64(3), "subject": "orders.ord-1", "payload": `{"type":"OrderPlaced"}`,
		"error": "decode: unknown type", "deliveries": int64(5), "parked_at": created, "stream_seq": int64(77),
		"retried_at": finished, "retry_result": "still fails",
	})
	got, err := dead.List(ctx, d.Projection, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !reflect.DeepEqual(got[0], d) {
		t.Errorf("dead letters read back:\n%+v\nwant\n%+v", got, d)
	}
}

// assertDocument compares the stored document id of coll with want, field
// names first, in any order. want goes through the same encoding and
// decoding as the stored document, so that both hold the driver's types
// for BSON values (DateTime for time.Time, int32 for int).
func assertDocument(t *testing.T, coll *mongo.Collection, id string, want bson.M) {
	t.Helper()
	var stored bson.M
	if err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Decode(&stored); err != nil {
		t.Fatal(err)
	}
	raw, err := bson.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	want = bson.M{}
	if err := bson.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	got, want := unordered(stored).(bson.M), unordered(want).(bson.M)
	if g, w := keys(got), keys(want); !slices.Equal(g, w) {
		t.Fatalf("%s %s has fields %v, want %v", coll.Name(), id, g, w)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s %s is\n%v\nwant\n%v", coll.Name(), id, got, want)
	}
}

func keys(m bson.M) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// unordered turns the embedded documents of v, which the driver decodes
// as bson.D, into bson.M: the order of a document's fields is no part of
// its shape.
func unordered(v any) any {
	switch v := v.(type) {
	case bson.D:
		m := bson.M{}
		for _, e := range v {
			m[e.Key] = unordered(e.Value)
		}
		return m
	case bson.M:
		m := bson.M{}
		for k, e := range v {
			m[k] = unordered(e)
		}
		return m
	case bson.A:
		a := make(bson.A, len(v))
		for i, e := range v {
			a[i] = unordered(e)
		}
		return a
	}
	return v
}
