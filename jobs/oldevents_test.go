package jobs_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
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

// oldEvents is the fixture of testdata/old-events (see its README): commit
// documents as binaries of every earlier schema stored them, one canonical
// extended JSON document a line, and what each order folds to.
const oldEvents = "../testdata/old-events/"

// oldCommits reads the fixture's commit documents, BSON types as stored.
func oldCommits(t *testing.T) []bson.D {
	t.Helper()
	f, err := os.Open(oldEvents + "commits.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []bson.D
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		var d bson.D
		if err := bson.UnmarshalExtJSON(sc.Bytes(), true, &d); err != nil {
			t.Fatalf("commits.jsonl line %d: %v", n, err)
		}
		docs = append(docs, d)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return docs
}

// expectedOrder is one order of expected.json: the JSON of the order as
// GET /v1/orders/{id} shows it, and the event types of its stream (path).
type expectedOrder struct {
	ID    string
	Path  string
	Order map[string]any // without path
}

func oldExpected(t *testing.T) []expectedOrder {
	t.Helper()
	b, err := os.ReadFile(oldEvents + "expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var raw []map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("expected.json: %v", err)
	}
	var out []expectedOrder
	for _, m := range raw {
		e := expectedOrder{ID: fmt.Sprint(m["order_id"]), Path: fmt.Sprint(m["path"]), Order: m}
		delete(m, "path")
		out = append(out, e)
	}
	return out
}

// asJSON is v as the generic JSON value the HTTP API would send.
func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOldEventsCoverEverySchema fails when an event type gains a schema
// version, or a new event type appears, and the fixture of old events has
// no event of it: every schema from 1 to domain.CurrentSchema of every
// type must be stored there, and nothing else.
func TestOldEventsCoverEverySchema(t *testing.T) {
	type typeSchema struct {
		Type   string
		Schema int
	}
	got := map[typeSchema]int{}
	for _, d := range oldCommits(t) {
		var c struct {
			Events []struct {
				Type   string `bson:"type"`
				Schema int    `bson:"schema_version"`
			} `bson:"events"`
		}
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := bson.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		for _, e := range c.Events {
			got[typeSchema{e.Type, e.Schema}]++
		}
	}
	want := map[typeSchema]bool{}
	for _, typ := range domain.EventTypes() {
		for v := 1; v <= domain.CurrentSchema(typ); v++ {
			want[typeSchema{typ, v}] = true
			if got[typeSchema{typ, v}] == 0 {
				t.Errorf("testdata/old-events has no %s of schema %d: add a generation to its gen.go and run it (see its README)", typ, v)
			}
		}
	}
	for ts, n := range got {
		if !want[ts] {
			t.Errorf("testdata/old-events holds %d %s of schema %d, which this build does not know", n, ts.Type, ts.Schema)
		}
	}
}

// TestOldEventsRebuildAndFold stores the fixture's commits as older
// binaries wrote them, raw into the events collection of a fresh store
// (before this build creates its indexes), then rebuilds both read models
// with the rebuild job and verifies them with the verify job: no poison
// stream, no drift. Every order, through the domain service (the fold of
// GET /v1/orders/{id}) and in order_summaries, equals the state written in
// the fixture, computed there without this code.
func TestOldEventsRebuildAndFold(t *testing.T) {
	docs := oldCommits(t)
	expected := oldExpected(t)
	ctx := projectiontest.Context(t, 90*time.Second)
	db := storetest.Database(t)
	raw := make([]any, len(docs))
	for i, d := range docs {
		raw[i] = d
	}
	if _, err := db.Collection(mongodb.CommitsCollection).InsertMany(ctx, raw); err != nil {
		t.Fatalf("insert the old commits: %v", err)
	}
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatalf("event store indexes: %v", err)
	}
	k, _ := newKit(t, ctx, es, db, "none", 0, 1) // no orders but the old ones
	k.worker(t, "w1", jobs.WorkerConfig{})

	var events int64
	for _, e := range expected {
		events += int64(len(strings.Fields(e.Path)))
	}
	streams := int64(len(expected))
	for _, name := range []string{projection.OrderSummaries.Name, projectiontest.CustomerTotals.Name} {
		job, err := k.jobs.StartRebuild(ctx, name, 2)
		if err != nil {
			t.Fatal(err)
		}
		job = k.waitJob(t, ctx, job.ID, 60*time.Second)
		if job.State != jobs.StateSucceeded || job.PoisonStreams != 0 || job.Streams != streams || job.Events != events {
			t.Fatalf("rebuild of %s: %s %s, %d poison streams, %d streams and %d events (want %d and %d)",
				name, job.State, job.Error, job.PoisonStreams, job.Streams, job.Events, streams, events)
		}
		if job.Report == nil || job.Report.Drift() != 0 {
			t.Errorf("rebuild of %s: verify before the switch: %+v", name, job.Report)
		}
		job, err = k.jobs.StartVerify(ctx, name, false)
		if err != nil {
			t.Fatal(err)
		}
		job = k.waitJob(t, ctx, job.ID, 30*time.Second)
		rep := job.Report
		if job.State != jobs.StateSucceeded || rep == nil {
			t.Fatalf("verify of %s: %s %s", name, job.State, job.Error)
		}
		if rep.Drift() != 0 || rep.PoisonStreams != 0 || rep.Digest != rep.ExpectedDigest || rep.Streams != streams || rep.Events != events {
			t.Errorf("verify of %s after the rebuild: %+v", name, *rep)
		}
	}

	svc := domain.NewService(k.es, nil)
	reader := mongodb.NewReader(db, k.ps, nil)
	var ids []string
	for _, e := range expected {
		ids = append(ids, e.ID)
		o, err := svc.Get(ctx, e.ID)
		if err != nil {
			t.Errorf("get %s (%s): %v", e.ID, e.Path, err)
			continue
		}
		if got := asJSON(t, o); !reflect.DeepEqual(got, e.Order) {
			t.Errorf("%s (%s) folds to\n %s\nwant\n %s", e.ID, e.Path, projectiontest.Dump(got), projectiontest.Dump(e.Order))
		}
		s, err := reader.Summary(ctx, e.ID)
		if err != nil {
			t.Errorf("summary %s: %v", e.ID, err)
			continue
		}
		if got := asJSON(t, s); !reflect.DeepEqual(got, e.Order) {
			t.Errorf("summary %s (%s) is\n %s\nwant\n %s", e.ID, e.Path, projectiontest.Dump(got), projectiontest.Dump(e.Order))
		}
		evs, err := k.es.Load(ctx, e.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
		if !slices.Equal(types, strings.Fields(e.Path)) {
			t.Errorf("%s: stream %v, want %s", e.ID, types, e.Path)
		}
	}
	// The customers' stats, and each read model equal to the fold.
	if err := projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, k.es, ids), true); err != nil {
		t.Error(err)
	}
}
