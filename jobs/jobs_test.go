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
	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projections"
	"github.com/orderd/orderd/projections/projectionstest"
)

// repairKit is what the repair jobs need on one database.
type repairKit struct {
	db   *mongo.Database
	es   *eventstore.Store
	ps   *projections.Pointers
	sums *projections.Projection[domain.Order]
	stat *projections.Projection[projections.Contribution]
	jobs *jobs.Jobs
}

func newRepairKit(t *testing.T, ctx context.Context, db *mongo.Database, es *eventstore.Store) *repairKit {
	ps := projections.NewPointers(db)
	k := &repairKit{db: db, es: es, ps: ps,
		sums: projections.NewProjection(db, projections.OrderSummaries, es, nil, ps),
		stat: projections.NewProjection(db, projections.CustomerOrderStats, es, nil, ps),
	}
	k.jobs = jobs.New(db, ps, es, map[string]string{
		projections.OrderSummaries.Name:     projections.OrderSummaries.Collection,
		projections.CustomerOrderStats.Name: projections.CustomerOrderStats.Collection,
	})
	return k
}

// projectedKit appends n orders named prefix000.. to a new database and
// writes their fold into both read models.
func projectedKit(t *testing.T, ctx context.Context, prefix string, n, customers int) (*repairKit, *projectionstest.Fixture) {
	t.Helper()
	db := storetest.Database(t)
	es := projectionstest.NewLog(t, ctx, db)
	f := projectionstest.NewFixture(t, ctx, es, prefix, n, customers)
	k := newRepairKit(t, ctx, db, es)
	k.project(t, ctx, f)
	return k, f
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
	w := jobs.NewWorker(k.jobs, k.es, nil, []jobs.Projection{k.sums, k.stat}, cfg, projectionstest.Logger(t))
	projectionstest.Go(t, "worker "+owner, w.Run)
}

// waitJob waits until the job is final and returns it.
func (k *repairKit) waitJob(t *testing.T, ctx context.Context, id string, limit time.Duration) domain.Job {
	t.Helper()
	var job domain.Job
	projectionstest.WaitFor(t, limit, "job "+id+" final", func() error {
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

// project writes the fold of f into both read models' active collections.
func (k *repairKit) project(t *testing.T, ctx context.Context, f *projectionstest.Fixture) {
	t.Helper()
	for _, apply := range []func(context.Context, []domain.Event) (projections.Outcome, map[string]error, error){
		projections.NewStore(k.db, projections.OrderSummaries, k.es, nil).Apply,
		projections.NewStore(k.db, projections.CustomerOrderStats, k.es, nil).Apply,
	} {
		if _, poison, err := apply(ctx, f.Flat); err != nil || len(poison) > 0 {
			t.Fatalf("project the fixture: %v %v", err, poison)
		}
	}
}

// TestVerifyReportsAndRepairsExactlyTheDrift alters the summaries behind
// the service's back (two deleted, two changed, one set back a version,
// one added for no stream) and checks that verify reports exactly those,
// that verify with repair fixes exactly those, and that a third verify
// finds no drift and a digest equal to the fold's.
func TestVerifyReportsAndRepairsExactlyTheDrift(t *testing.T) {
	ctx := projectionstest.Context(t, 90*time.Second)
	k, f := projectedKit(t, ctx, "vfy", 40, 5)
	db := k.db
	k.worker(t, "w1", jobs.WorkerConfig{})

	clean := k.verify(t, ctx, false)
	if clean.Drift() != 0 || clean.Digest != clean.ExpectedDigest || clean.Streams != 40 || clean.Documents != 40 {
		t.Fatalf("verify before any drift: %+v", clean)
	}

	coll := db.Collection(projections.OrderSummaries.Collection)
	del := []string{f.IDs[3], f.IDs[17]}
	changed := []string{f.IDs[5], f.IDs[22]}
	staleID := f.IDs[0] // lifecycle 0 has six events
	for _, id := range del {
		projectionstest.Must(t)(coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}))
	}
	projectionstest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: changed[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 1}}}}))
	projectionstest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: changed[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "customer_id", Value: "someone-else"}}}}))
	projectionstest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: staleID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: 2}, {Key: "status", Value: "approved"}}}}))
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "ghost"}, {Key: "version", Value: 1}, {Key: "status", Value: "created"}}); err != nil {
		t.Fatal(err)
	}

	want := map[string][]string{"missing": del, "different": changed, "stale": {staleID}, "extra": {"ghost"}}
	check := func(rep domain.VerifyReport, what string) {
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
	projectionstest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: untouched}}, bson.D{{Key: "$set", Value: bson.D{{Key: "marker", Value: "kept"}}}}))

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
	if err := projectionstest.DiffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartVerify(ctx, "no_such_projection", false); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("verify of an unknown projection: %v, want not found", err)
	}
}

func (k *repairKit) verify(t *testing.T, ctx context.Context, repair bool) domain.VerifyReport {
	t.Helper()
	job, err := k.jobs.StartVerify(ctx, projections.OrderSummaries.Name, repair)
	if err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != domain.StateSucceeded || job.Report == nil {
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

// TestRebuildUnderLoadNeverShowsAHalfBuiltModel rebuilds order_summaries
// in two partitions run by two workers while a writer keeps appending and
// publishing events and readers poll every summary: no reader ever gets a
// 404 for an order that existed before the rebuild, or a version below
// one it saw; the job switches the pointer to the new collection, the read
// models end equal to the fold of the log, and the replaced collection is
// dropped after the grace period (invariants 5 and 6).
func TestRebuildUnderLoadNeverShowsAHalfBuiltModel(t *testing.T) {
	ctx := projectionstest.Context(t, 120*time.Second)
	b := projectionstest.NewBus(t, ctx)
	db := storetest.Database(t)
	es := projectionstest.NewLog(t, ctx, db)
	f := projectionstest.NewFixture(t, ctx, es, "pre", 50, 9)
	k := newRepairKit(t, ctx, db, es)
	cfg := b.RunnerConfig()
	cfg.Workers = 1
	dead := projections.NewDeadLetters(db)
	sums := projections.NewRunner(k.sums, b.JS, dead, cfg, projectionstest.Logger(t), nil)
	stats := projections.NewRunner(k.stat, b.JS, dead, cfg, projectionstest.Logger(t), nil)
	projectionstest.Go(t, "summaries runner", sums.Run)
	projectionstest.Go(t, "stats runner", stats.Run)
	b.PublishEvents(t, ctx, f.Flat, func(e domain.Event) string { return e.ID })
	projectionstest.WaitFor(t, 30*time.Second, "read models built", func() error { return projectionstest.DiffReadModels(ctx, db, f) })
	began := time.Now()

	// Writer: new orders, event by event, published like the relay does.
	var mu sync.Mutex
	written := slices.Clone(f.IDs)
	stopWriter := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		at := time.Date(2024, 9, 1, 0, 0, 0, 0, time.UTC)
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			case <-time.After(25 * time.Millisecond):
			}
			// Alternate: a new order, or the next events of an old one
			// (new ids land anywhere in the id space, as real ones do).
			n := (i * 37) % 1000
			id := fmt.Sprintf("new%03d", n)
			before, err := es.Load(ctx, id, 0)
			if err != nil {
				t.Errorf("writer: %v", err)
				return
			}
			appendStreamNoFatal(t, ctx, es, id, projectionstest.Lifecycle(n, "cust-new"), at)
			loaded, err := es.Load(ctx, id, 0)
			if err != nil || len(loaded) == 0 {
				continue
			}
			for _, e := range loaded[len(before):] {
				body, _ := domain.MarshalEvent(e)
				if _, err := b.JS.Publish(ctx, b.Stream.Subject(id), body); err != nil {
					t.Errorf("writer publish: %v", err)
					return
				}
			}
			mu.Lock()
			if !slices.Contains(written, id) {
				written = append(written, id)
			}
			mu.Unlock()
		}
	}()

	// Readers: every pre-existing order must always be found, and never at
	// a lower version than seen before.
	seen := map[string]int64{}
	readerErrs := make(chan error, 1)
	stopReaders := make(chan struct{})
	readersDone := make(chan struct{})
	reader := projections.NewReader(db, projections.NewPointers(db))
	go func() {
		defer close(readersDone)
		for {
			select {
			case <-stopReaders:
				return
			default:
			}
			for _, id := range f.IDs {
				o, err := reader.Summary(ctx, id)
				if err == nil && o.Version < seen[id] {
					err = fmt.Errorf("summary %s went back from v%d to v%d", id, seen[id], o.Version)
				}
				if err != nil {
					select {
					case readerErrs <- err:
					default:
					}
					return
				}
				seen[id] = o.Version
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	// Paced, and with a settling time longer than the readers' pointer
	// cache, so that a model switched too early would be read half-built.
	wc := jobs.WorkerConfig{BatchStreams: 10, Grace: time.Second, Settle: 1500 * time.Millisecond, MaxEventsPerSecond: 300}
	k.worker(t, "w1", wc)
	k.worker(t, "w2", wc)
	time.Sleep(200 * time.Millisecond)
	job, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 1); !errors.Is(err, domain.ErrJobRunning) {
		t.Errorf("a second rebuild while one runs: %v, want ErrJobRunning", err)
	}
	job = k.waitJob(t, ctx, job.ID, 90*time.Second)
	t.Logf("rebuild done after %v", time.Since(began).Round(time.Millisecond))
	close(stopWriter)
	<-writerDone
	close(stopReaders)
	<-readersDone
	select {
	case err := <-readerErrs:
		t.Errorf("reader: %v", err)
	default:
	}
	if job.State != domain.StateSucceeded {
		t.Fatalf("rebuild %s: %s: %s", job.ID, job.State, job.Error)
	}
	owners := map[string]bool{}
	for _, task := range job.Tasks {
		owners[task.Owner] = true
		if task.Attempts != 1 {
			t.Errorf("task %s claimed %d times, want 1", task.Name, task.Attempts)
		}
	}
	if len(job.Tasks) != 4 || job.Partitions != 2 {
		t.Errorf("rebuild in %d partitions with %d tasks, want 2 and 4 (plan, 2 partitions, finish)", job.Partitions, len(job.Tasks))
	}
	t.Logf("rebuild: %d events, %d streams, tasks run by %v, repaired before switch %d", job.Events, job.Streams, owners, job.Report.Repaired)
	ptr, err := k.ps.Get(ctx, projections.OrderSummaries.Name, projections.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Shadow != "" {
		t.Errorf("pointer after the rebuild: %+v, want active %s", ptr, job.Shadow)
	}
	projectionstest.WaitLag(t, ctx, 30*time.Second, sums, stats)
	mu.Lock()
	all := projectionstest.LoadFixture(t, ctx, es, written)
	mu.Unlock()
	projectionstest.WaitFor(t, 30*time.Second, "read models equal to the fold after the rebuild", func() error { return projectionstest.DiffReadModels(ctx, db, all) })
	projectionstest.WaitFor(t, 10*time.Second, "replaced collection dropped", func() error {
		names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: projections.OrderSummaries.Collection}})
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("%v still exists", names)
		}
		return nil
	})
	if _, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 1); err != nil {
		t.Errorf("a rebuild after the first finished: %v", err)
	}
}

// appendStreamNoFatal appends the next events of stream id (up to datas),
// one per commit, tolerating a stream that is already complete.
func appendStreamNoFatal(t *testing.T, ctx context.Context, es *eventstore.Store, id string, datas []domain.EventData, at time.Time) {
	evs, err := es.Load(ctx, id, 0)
	if err != nil {
		t.Errorf("load %s: %v", id, err)
		return
	}
	version := int64(len(evs))
	if version >= int64(len(datas)) {
		return
	}
	for n := 0; n < 2 && version < int64(len(datas)); n++ {
		c := domain.Commit{StreamID: id, StreamType: domain.StreamTypeOrder, ExpectedVersion: version,
			Events: []domain.Event{projectionstest.NewEvent(id, version+1, datas[version], at.Add(time.Duration(version)*time.Hour))}}
		if _, err := es.Append(ctx, c); err != nil {
			t.Errorf("append %s v%d: %v", id, version+1, err)
			return
		}
		version++
	}
}

// TestTaskClaimedByExactlyOneWorker runs eight workers on one verify job:
// its task is claimed once, by one of them (invariant 6).
func TestTaskClaimedByExactlyOneWorker(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	k, _ := projectedKit(t, ctx, "clm", 10, 2)
	job, err := k.jobs.StartVerify(ctx, projections.OrderSummaries.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		k.worker(t, fmt.Sprintf("w%d", i), jobs.WorkerConfig{Poll: 5 * time.Millisecond})
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != domain.StateSucceeded || len(job.Tasks) != 1 || job.Tasks[0].Attempts != 1 {
		t.Fatalf("job %s: %+v", job.State, job.Tasks)
	}
	if task := job.Tasks[0]; task.Epoch != 1 {
		t.Errorf("task at epoch %d, want 1: one claim", task.Epoch)
	}
}

// TestRebuildResumesFromTheCursorOfADeadRunner leaves a rebuild partition
// as a runner that died halfway leaves it (claimed, lease expired, cursor
// and counters saved) and checks that a worker resumes it from that cursor
// instead of starting over, and that the job completes with every stream
// counted once.
func TestRebuildResumesFromTheCursorOfADeadRunner(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	k, f := projectedKit(t, ctx, "res", 30, 3)
	db, es := k.db, k.es
	job, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A worker whose settling time never ends runs only the plan.
	planner := jobs.NewWorker(k.jobs, es, nil, []jobs.Projection{k.sums, k.stat},
		jobs.WorkerConfig{Owner: "planner", Poll: 20 * time.Millisecond, Settle: time.Hour}, projectionstest.Logger(t))
	pctx, stopPlanner := context.WithCancel(ctx)
	planned := make(chan error, 1)
	go func() { planned <- planner.Run(pctx) }()
	projectionstest.WaitFor(t, 20*time.Second, "plan done", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		if p, ok := j.Task("plan"); !ok || p.State != "done" {
			return fmt.Errorf("plan %+v", p)
		}
		if _, ok := j.Task("part-0"); !ok {
			return errors.New("no partition")
		}
		return nil
	})
	stopPlanner()
	if err := <-planned; err != nil {
		t.Fatal(err)
	}
	// The dead runner did the first 12 streams (ids sort in log order
	// here: same length, no prefixes).
	done := f.IDs[:12]
	var events int64
	for _, id := range done {
		events += int64(len(f.Events[id]))
	}
	shadow := db.Collection(job.Shadow)
	for _, id := range done {
		o := f.Orders[id]
		projectionstest.Must(t)(shadow.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "attempted", Value: o.Version}, {Key: "version", Value: o.Version}, {Key: "id", Value: o.ID}}))
	}
	part := job.ID + "/part-0"
	projectionstest.Must(t)(db.Collection(jobs.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: part}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "state", Value: "running"}, {Key: "owner", Value: "dead"}, {Key: "epoch", Value: 1}, {Key: "attempts", Value: 1},
		{Key: "lease_until", Value: time.Now().Add(-time.Second)}, {Key: "started_at", Value: time.Now().Add(-time.Minute)},
		{Key: "cursor", Value: done[len(done)-1]}, {Key: "streams", Value: len(done)}, {Key: "events", Value: events},
	}}}))
	k.worker(t, "alive", jobs.WorkerConfig{BatchStreams: 5})
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != domain.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}
	p, _ := job.Task("part-0")
	if p.Owner != "alive" || p.Attempts != 2 || len(p.Resumes) != 1 || p.Resumes[0].Cursor != done[len(done)-1] || p.Resumes[0].Streams != 12 {
		t.Errorf("partition after the takeover: owner %s attempts %d resumes %+v", p.Owner, p.Attempts, p.Resumes)
	}
	if p.Streams != int64(len(f.IDs)) || p.Events != int64(len(f.Flat)) {
		t.Errorf("partition counted %d streams and %d events, want %d and %d (each once)", p.Streams, p.Events, len(f.IDs), len(f.Flat))
	}
	// The dead runner's half-written documents (only id and version) were
	// caught by the verify before the switch.
	if job.Report == nil || job.Report.Different != 12 || job.Report.Repaired != 12 {
		t.Errorf("verify before the switch: %+v", job.Report)
	}
	if err := projectionstest.DiffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
}

// TestRebuildCancel stops a running rebuild: the job ends canceled, the
// readers' collection never changed, the shadow is dropped after the grace
// period, and the projection can be rebuilt again.
func TestRebuildCancel(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	k, f := projectedKit(t, ctx, "cnl", 60, 4)
	db := k.db
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, MaxEventsPerSecond: 40, Grace: 500 * time.Millisecond})
	job, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	projectionstest.WaitFor(t, 20*time.Second, "rebuild under way", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		if j.Streams == 0 || j.State != domain.StateRunning {
			return fmt.Errorf("%s, %d streams", j.State, j.Streams)
		}
		return nil
	})
	if _, err := k.jobs.Cancel(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 20*time.Second)
	if job.State != domain.StateCanceled || !job.CancelRequested {
		t.Fatalf("after cancel: %s (cancel requested %v) %s", job.State, job.CancelRequested, job.Error)
	}
	if p, _ := job.Task("part-0"); p.State != "canceled" || job.Streams >= int64(len(f.IDs)) {
		t.Errorf("partition %s after %d of %d streams", p.State, job.Streams, len(f.IDs))
	}
	if _, err := k.jobs.Cancel(ctx, job.ID); !errors.Is(err, domain.ErrJobFinished) {
		t.Errorf("cancel of a canceled job: %v, want ErrJobFinished", err)
	}
	ptr, err := k.ps.Get(ctx, projections.OrderSummaries.Name, projections.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != projections.OrderSummaries.Collection || ptr.Shadow != "" {
		t.Errorf("pointer after cancel: %+v", ptr)
	}
	projectionstest.WaitFor(t, 10*time.Second, "shadow dropped", func() error {
		names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: job.Shadow}})
		if err != nil || len(names) > 0 {
			return fmt.Errorf("%v %v", names, err)
		}
		return nil
	})
	if err := projectionstest.DiffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, projections.OrderSummaries.Name, 1); err != nil {
		t.Errorf("rebuild after a canceled one: %v", err)
	}
}

// TestRebuildCancelAfterTheSwitchIsTooLate leaves a rebuild as a finish
// that died right after switching the pointer leaves it (the job not yet
// final, the lock held, the finish task claimed with its lease run out),
// asks to cancel it, and lets a worker run the finish again: the cancel is
// refused as too late, and even with a cancel request recorded on the job
// (as a binary without that check records it) the finish completes the
// job as succeeded, never putting the collection readers now read on the
// drop list.
func TestRebuildCancelAfterTheSwitchIsTooLate(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	k, f := projectedKit(t, ctx, "late", 20, 3)
	db := k.db
	name := projections.OrderSummaries.Name
	// A long grace keeps whatever is put on the drop list there to be seen.
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, Grace: time.Hour})
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if job = k.waitJob(t, ctx, job.ID, 30*time.Second); job.State != domain.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}
	switched, err := k.ps.Get(ctx, name, projections.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if switched.Active != job.Shadow {
		t.Fatalf("pointer after the rebuild: %+v, want %s active", switched, job.Shadow)
	}

	// The finish died after the switch, before it recorded the job's end.
	projectionstest.Must(t)(db.Collection(jobs.Collection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "state", Value: domain.StateRunning}}},
		{Key: "$unset", Value: bson.D{{Key: "finished_at", Value: ""}}}}))
	projectionstest.Must(t)(db.Collection(jobs.LocksCollection).InsertOne(ctx, bson.D{
		{Key: "_id", Value: "rebuild:" + name}, {Key: "job_id", Value: job.ID}, {Key: "since", Value: time.Now().UTC()}}))

	_, cancelErr := k.jobs.Cancel(ctx, job.ID)
	projectionstest.Must(t)(db.Collection(jobs.Collection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "cancel_requested", Value: true}}}}))
	// Its lease runs out: the worker claims the finish again.
	projectionstest.Must(t)(db.Collection(jobs.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID + "/finish"}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "state", Value: "running"}, {Key: "owner", Value: "dead"},
			{Key: "lease_until", Value: time.Now().Add(-time.Second).UTC()}}},
		{Key: "$unset", Value: bson.D{{Key: "finished_at", Value: ""}}}}))

	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if !errors.Is(cancelErr, domain.ErrJobFinished) {
		t.Errorf("cancel after the switch: %v, want ErrJobFinished", cancelErr)
	}
	if job.State != domain.StateSucceeded {
		t.Errorf("job after a cancel that came after the switch: %s %s, want succeeded", job.State, job.Error)
	}
	// The finish records its task's end after the job's.
	projectionstest.WaitFor(t, 10*time.Second, "finish run again", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		if fin, _ := j.Task("finish"); fin.Owner != "w1" || fin.State != "done" {
			return fmt.Errorf("finish task: owner %s, state %s", fin.Owner, fin.State)
		}
		return nil
	})
	ptr, err := projections.NewPointers(db).Get(ctx, name, projections.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Shadow != "" {
		t.Errorf("pointer after the late cancel: %+v, want %s active", ptr, job.Shadow)
	}
	var retired []bson.M
	cur, err := db.Collection(projections.RetiredCollection).Find(ctx, bson.D{{Key: "_id", Value: job.Shadow}})
	if err == nil {
		err = cur.All(ctx, &retired)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(retired) > 0 {
		t.Errorf("the active collection %s is on the drop list: %v", job.Shadow, retired)
	}
	names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: job.Shadow}})
	if err != nil || len(names) != 1 {
		t.Errorf("active collection %s: %v %v", job.Shadow, names, err)
	}
	if err := projectionstest.DiffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, name, 1); err != nil {
		t.Errorf("rebuild after the late cancel: %v", err)
	}
}

// TestVerifyRepairStopsWhenItsCollectionIsReplaced: a verify with repair
// whose collection is replaced and dropped by a rebuild between its report
// and its repairs stops with an error and writes nothing, rather than
// recreating the dropped collection with its upserts.
func TestVerifyRepairStopsWhenItsCollectionIsReplaced(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	k, f := projectedKit(t, ctx, "gone", 12, 3)
	db := k.db
	name, coll := projections.OrderSummaries.Name, projections.OrderSummaries.Collection
	// Drift to repair: two summaries missing.
	projectionstest.Must(t)(db.Collection(coll).DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{f.IDs[2], f.IDs[7]}}}}}))

	// The repairs read the log (the recheck of each suspect) after the
	// report: that is when another rebuild switches the projection to its
	// collection and the replaced one is dropped.
	next := coll + "_next"
	var once sync.Once
	hooked := &hookedLog{Store: k.es, before: func() {
		once.Do(func() {
			projectionstest.Must(t)(db.Collection(projections.PointersCollection).ReplaceOne(ctx, bson.D{{Key: "_id", Value: name}},
				bson.D{{Key: "_id", Value: name}, {Key: "active", Value: next}, {Key: "generation", Value: int64(7)}},
				options.Replace().SetUpsert(true)))
			if err := db.Collection(coll).Drop(ctx); err != nil {
				t.Error(err)
			}
		})
	}}
	k.sums = projections.NewProjection(db, projections.OrderSummaries, hooked, nil, k.ps)
	k.worker(t, "w1", jobs.WorkerConfig{MaxAttempts: 1})
	job, err := k.jobs.StartVerify(ctx, name, true)
	if err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != domain.StateFailed || !strings.Contains(job.Error, domain.ErrPointerMoved.Error()) {
		t.Errorf("verify whose collection was dropped before its repairs: %s %q, want failed as the pointer moved", job.State, job.Error)
	}
	names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$in", Value: bson.A{coll, next}}}}})
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
	*eventstore.Store
	before func()
}

func (h *hookedLog) LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error) {
	h.before()
	return h.Store.LoadFrom(ctx, streamID, from)
}

// TestReplayKeepsMessageIDs republishes one stream and then a recorded-time
// range of the log: every message carries its event's id as Nats-Msg-Id,
// so the stream's de-duplication window keeps one message per event.
func TestReplayKeepsMessageIDs(t *testing.T) {
	ctx := projectionstest.Context(t, 60*time.Second)
	b := projectionstest.NewBus(t, ctx)
	db := storetest.Database(t)
	es := projectionstest.NewLog(t, ctx, db)
	f := projectionstest.NewFixture(t, ctx, es, "rpl", 6, 2)
	k := newRepairKit(t, ctx, db, es)
	republish := func(ctx context.Context, evs []domain.Event) (int, error) {
		return eventstore.Republish(ctx, b.JS, b.Stream, evs)
	}
	w := jobs.NewWorker(k.jobs, es, republish, []jobs.Projection{k.sums, k.stat},
		jobs.WorkerConfig{Owner: "w1", Poll: 50 * time.Millisecond}, projectionstest.Logger(t))
	projectionstest.Go(t, "worker", w.Run)

	replay := func(spec domain.ReplaySpec) domain.Job {
		t.Helper()
		job, err := k.jobs.StartReplay(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		job = k.waitJob(t, ctx, job.ID, 20*time.Second)
		if job.State != domain.StateSucceeded {
			t.Fatalf("replay %+v: %s %s", spec, job.State, job.Error)
		}
		return job
	}
	one := f.IDs[2]
	if job := replay(domain.ReplaySpec{StreamID: one}); job.Events != int64(len(f.Events[one])) {
		t.Errorf("replay of %s published %d events, want %d", one, job.Events, len(f.Events[one]))
	}
	if got := b.Messages(t, ctx); got != uint64(len(f.Events[one])) {
		t.Errorf("stream holds %d messages after replaying %s, want %d", got, one, len(f.Events[one]))
	}
	all := replay(domain.ReplaySpec{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	if all.Events != int64(len(f.Flat)) || all.Streams != int64(len(f.IDs)) {
		t.Errorf("range replay published %d events of %d streams, want %d of %d", all.Events, all.Streams, len(f.Flat), len(f.IDs))
	}
	n := b.Messages(t, ctx)
	if n != uint64(len(f.Flat)) {
		t.Errorf("stream holds %d messages, want %d: one per event", n, len(f.Flat))
	}
	st, err := b.JS.Stream(ctx, b.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, e := range f.Flat {
		ids[e.ID] = true
	}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		e, err := domain.UnmarshalEvent(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if id := m.Header.Get("Nats-Msg-Id"); id != e.ID || !ids[id] {
			t.Errorf("message %d: Nats-Msg-Id %q for event %s", seq, id, e.ID)
		}
		delete(ids, e.ID)
	}
	if len(ids) > 0 {
		t.Errorf("events not republished: %v", ids)
	}
	if _, err := k.jobs.StartReplay(ctx, domain.ReplaySpec{StreamID: "a.b"}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("replay of an invalid stream id: %v", err)
	}
}
