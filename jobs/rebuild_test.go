package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// TestRebuildUnderLoadNeverShowsAHalfBuiltModel rebuilds order_summaries
// in two partitions run by two workers while a writer keeps appending and
// publishing events and readers poll every summary: no reader ever gets a
// 404 for an order that existed before the rebuild, or a version below
// one it saw; the job switches the pointer to the new collection, the read
// models end equal to the fold of the log, and the replaced collection is
// dropped after the grace period (invariants 5 and 6).
func TestRebuildUnderLoadNeverShowsAHalfBuiltModel(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	k, f := newKit(t, ctx, es, db, "pre", 50, 9)
	cfg := b.RunnerConfig()
	sums := projectortest.Run(t, b, db, k.sums, cfg, nil)
	stats := projectortest.Run(t, b, db, k.stat, cfg, nil)
	b.PublishEvents(t, ctx, f.Flat, "")
	projectiontest.WaitFor(t, 30*time.Second, "read models built", func() error { return projectiontest.DiffReadModels(ctx, db, f, true) })
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
			appendStreamNoFatal(t, ctx, es, id, projectiontest.Lifecycle(n, "cust-new"), at)
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
	reader := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
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
	job, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1); !errors.Is(err, domain.ErrJobRunning) {
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
	if job.State != jobs.StateSucceeded {
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
	ptr, err := k.ps.Get(ctx, projection.OrderSummaries.Name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Shadow != "" {
		t.Errorf("pointer after the rebuild: %+v, want active %s", ptr, job.Shadow)
	}
	projectortest.WaitLag(t, ctx, 30*time.Second, sums, stats)
	mu.Lock()
	all := projectiontest.LoadFixture(t, ctx, es, written)
	mu.Unlock()
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after the rebuild", func() error { return projectiontest.DiffReadModels(ctx, db, all, true) })
	projectiontest.WaitFor(t, 10*time.Second, "replaced collection dropped", func() error {
		names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: projection.OrderSummaries.Collection}, {Key: "type", Value: "collection"}})
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("%v still exists", names)
		}
		return nil
	})
	if _, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1); err != nil {
		t.Errorf("a rebuild after the first finished: %v", err)
	}
}

// appendStreamNoFatal appends the next events of stream id (up to datas),
// one per commit, tolerating a stream that is already complete.
func appendStreamNoFatal(t *testing.T, ctx context.Context, es *mongodb.EventStore, id string, datas []domain.EventData, at time.Time) {
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
			Events: []domain.Event{projectiontest.NewEvent(id, version+1, datas[version], at.Add(time.Duration(version)*time.Hour))}}
		if _, err := es.Append(ctx, c); err != nil {
			t.Errorf("append %s v%d: %v", id, version+1, err)
			return
		}
		version++
	}
}

// TestRebuildResumesFromTheCursorOfADeadRunner leaves a rebuild partition
// as a runner that died halfway leaves it (claimed, lease expired, cursor
// and counters saved) and checks that a worker resumes it from that cursor
// instead of starting over, and that the job completes with every stream
// counted once.
func TestRebuildResumesFromTheCursorOfADeadRunner(t *testing.T) {
	ctx, k, f := projectedKit(t, 60*time.Second, "res", 30, 3)
	db, es := k.db, k.es
	job, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A worker whose settling time never ends runs only the plan.
	planner := jobs.NewWorker(k.jobs, es, nil,
		jobs.WorkerConfig{Owner: "planner", Poll: 20 * time.Millisecond, Settle: time.Hour}, projectiontest.Logger(t))
	pctx, stopPlanner := context.WithCancel(ctx)
	planned := make(chan error, 1)
	go func() { planned <- planner.Run(pctx) }()
	projectiontest.WaitFor(t, 20*time.Second, "plan done", func() error {
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
		projectiontest.Must(t)(shadow.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "version", Value: o.Version}, {Key: "id", Value: o.ID}}))
	}
	part := job.ID + "/part-0"
	projectiontest.Must(t)(db.Collection(mongodb.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: part}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "state", Value: "running"}, {Key: "owner", Value: "dead"}, {Key: "epoch", Value: 1}, {Key: "attempts", Value: 1},
		{Key: "lease_until", Value: time.Now().Add(-time.Second)}, {Key: "started_at", Value: time.Now().Add(-time.Minute)},
		{Key: "cursor", Value: done[len(done)-1]}, {Key: "streams", Value: len(done)}, {Key: "events", Value: events},
	}}}))
	k.worker(t, "alive", jobs.WorkerConfig{BatchStreams: 5})
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != jobs.StateSucceeded {
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
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
}

// TestRebuildOverAnAbandonedShadowKeepsItAWhile: a rebuild that finds the
// shadow of one that died retires it with a grace, not for an immediate
// drop: projectors may still write it until they re-read the pointer, and
// a write after the drop would re-create it out of every pointer's sight.
// The sums its scan recorded go the same way.
func TestRebuildOverAnAbandonedShadowKeepsItAWhile(t *testing.T) {
	ctx, k, _ := projectedKit(t, 60*time.Second, "abd", 4, 2)
	const abandoned = "order_summaries_abandoned"
	if _, err := k.ps.Update(ctx, projection.OrderSummaries.Name, projection.OrderSummaries.Collection, func(p *projection.Pointer) (bool, error) {
		p.Shadow, p.ShadowJob = abandoned, "dead-job"
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if _, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1); err != nil {
		t.Fatal(err)
	}
	var retired struct {
		DropAfter time.Time `bson:"drop_after"`
	}
	if err := k.db.Collection(mongodb.RetiredCollection).FindOne(ctx, bson.D{{Key: "_id", Value: abandoned}}).Decode(&retired); err != nil {
		t.Fatalf("the abandoned shadow is not on the drop list: %v", err)
	}
	if retired.DropAfter.Before(started.Add(10 * time.Second)) {
		t.Errorf("the abandoned shadow is dropped after %v, %v after the new rebuild started; want a grace", retired.DropAfter, retired.DropAfter.Sub(started))
	}
	if err := k.db.Collection(mongodb.RetiredCollection).FindOne(ctx, bson.D{{Key: "_id", Value: projection.SumsCollection(abandoned)}}).Decode(&retired); err != nil {
		t.Fatalf("the abandoned shadow's sums are not on the drop list: %v", err)
	}
	if retired.DropAfter.Before(started.Add(10 * time.Second)) {
		t.Errorf("the abandoned shadow's sums are dropped after %v, %v after the new rebuild started; want a grace", retired.DropAfter, retired.DropAfter.Sub(started))
	}
}

// TestRebuildCancel stops a running rebuild: the job ends canceled, the
// readers' collection never changed, the shadow and the sums its scan
// recorded are dropped after the grace period, and the projection can be
// rebuilt again.
func TestRebuildCancel(t *testing.T) {
	ctx, k, f := projectedKit(t, 60*time.Second, "cnl", 60, 4)
	db := k.db
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, MaxEventsPerSecond: 40, Grace: 500 * time.Millisecond})
	job, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	projectiontest.WaitFor(t, 20*time.Second, "rebuild under way", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		if j.Streams == 0 || j.State != jobs.StateRunning {
			return fmt.Errorf("%s, %d streams", j.State, j.Streams)
		}
		return nil
	})
	sums := projection.SumsCollection(job.Shadow)
	if n, err := db.Collection(sums).CountDocuments(ctx, bson.D{}); err != nil || n == 0 {
		t.Errorf("sums of the scan under way: %d, %v", n, err)
	}
	if _, err := k.jobs.Cancel(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	job = k.waitJob(t, ctx, job.ID, 20*time.Second)
	if job.State != jobs.StateCanceled || !job.CancelRequested {
		t.Fatalf("after cancel: %s (cancel requested %v) %s", job.State, job.CancelRequested, job.Error)
	}
	if p, _ := job.Task("part-0"); p.State != "canceled" || job.Streams >= int64(len(f.IDs)) {
		t.Errorf("partition %s after %d of %d streams", p.State, job.Streams, len(f.IDs))
	}
	if _, err := k.jobs.Cancel(ctx, job.ID); !errors.Is(err, domain.ErrJobFinished) {
		t.Errorf("cancel of a canceled job: %v, want ErrJobFinished", err)
	}
	ptr, err := k.ps.Get(ctx, projection.OrderSummaries.Name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != projection.OrderSummaries.Collection || ptr.Shadow != "" {
		t.Errorf("pointer after cancel: %+v", ptr)
	}
	projectiontest.WaitFor(t, 10*time.Second, "shadow and its sums dropped", func() error {
		names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$in", Value: bson.A{job.Shadow, sums}}}}})
		if err != nil || len(names) > 0 {
			return fmt.Errorf("%v %v", names, err)
		}
		return nil
	})
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 1); err != nil {
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
	ctx, k, f := projectedKit(t, 60*time.Second, "late", 20, 3)
	db := k.db
	name := projection.OrderSummaries.Name
	// A long grace keeps whatever is put on the drop list there to be seen.
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, Grace: time.Hour})
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if job = k.waitJob(t, ctx, job.ID, 30*time.Second); job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}
	switched, err := k.ps.Get(ctx, name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if switched.Active != job.Shadow {
		t.Fatalf("pointer after the rebuild: %+v, want %s active", switched, job.Shadow)
	}

	// The finish died after the switch, before it recorded the job's end.
	projectiontest.Must(t)(db.Collection(mongodb.JobsCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "state", Value: jobs.StateRunning}}},
		{Key: "$unset", Value: bson.D{{Key: "finished_at", Value: ""}}}}))
	projectiontest.Must(t)(db.Collection(mongodb.LocksCollection).InsertOne(ctx, bson.D{
		{Key: "_id", Value: "rebuild:" + name}, {Key: "job_id", Value: job.ID}, {Key: "since", Value: time.Now().UTC()}}))
	if _, err := k.jobs.SwitchBack(ctx, name); !errors.Is(err, domain.ErrJobRunning) {
		t.Errorf("a switch back while the switched rebuild is not final: %v, want ErrJobRunning", err)
	}

	_, cancelErr := k.jobs.Cancel(ctx, job.ID)
	projectiontest.Must(t)(db.Collection(mongodb.JobsCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "cancel_requested", Value: true}}}}))
	// Its lease runs out: the worker claims the finish again.
	projectiontest.Must(t)(db.Collection(mongodb.TasksCollection).UpdateOne(ctx, bson.D{{Key: "_id", Value: job.ID + "/finish"}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "state", Value: "running"}, {Key: "owner", Value: "dead"},
			{Key: "lease_until", Value: time.Now().Add(-time.Second).UTC()}}},
		{Key: "$unset", Value: bson.D{{Key: "finished_at", Value: ""}}}}))

	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if !errors.Is(cancelErr, domain.ErrJobFinished) {
		t.Errorf("cancel after the switch: %v, want ErrJobFinished", cancelErr)
	}
	if job.State != jobs.StateSucceeded {
		t.Errorf("job after a cancel that came after the switch: %s %s, want succeeded", job.State, job.Error)
	}
	// The finish records its task's end after the job's.
	projectiontest.WaitFor(t, 10*time.Second, "finish run again", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		if fin, _ := j.Task("finish"); fin.Owner != "w1" || fin.State != "done" {
			return fmt.Errorf("finish task: owner %s, state %s", fin.Owner, fin.State)
		}
		return nil
	})
	ptr, err := mongodb.NewPointers(db).Get(ctx, name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Shadow != "" {
		t.Errorf("pointer after the late cancel: %+v, want %s active", ptr, job.Shadow)
	}
	var retired []bson.M
	cur, err := db.Collection(mongodb.RetiredCollection).Find(ctx, bson.D{{Key: "_id", Value: job.Shadow}})
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
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
	if _, err := k.jobs.StartRebuild(ctx, name, 1); err != nil {
		t.Errorf("rebuild after the late cancel: %v", err)
	}
}

// TestRebuildMetrics runs rebuilds of two partitions on a Worker with
// metrics: orderd_rebuild_running is 1 while it works and 0 after,
// orderd_rebuild_events_done and orderd_rebuild_streams_done grow during
// the scan and end at the log's totals, and a second rebuild counts
// afresh rather than adding to the first.
func TestRebuildMetrics(t *testing.T) {
	ctx, k, f := projectedKit(t, 90*time.Second, "rbm", 30, 3)
	db := k.db

	reg := prometheus.NewRegistry()
	m := jobs.NewMetrics(reg)
	name := projection.OrderSummaries.Name
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 0 {
			t.Errorf("%s before any rebuild: %d series, want none", g, n)
		}
	}
	// Paced, so the scan lasts long enough to be watched on a busy
	// machine: about two seconds for the fixture's events, in two
	// partitions.
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 4, MaxEventsPerSecond: float64(len(f.Flat)) / 4, Metrics: m})
	// A worker with metrics exposes the gauges of the projections it
	// manages at once, at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 2 {
			t.Errorf("%s once the worker is up: %d series, want 3 (one per projection)", g, n)
		}
	}

	for round := 1; round <= 2; round++ {
		job, err := k.jobs.StartRebuild(ctx, name, 2)
		if err != nil {
			t.Fatal(err)
		}
		// Mid-scan: running, and some but not all of the events counted.
		projectiontest.WaitFor(t, 20*time.Second, fmt.Sprintf("rebuild %d under way in the metrics", round), func() error {
			running := projectiontest.Metric(t, reg, "orderd_rebuild_running", name)
			events := projectiontest.Metric(t, reg, "orderd_rebuild_events_done", name)
			streams := projectiontest.Metric(t, reg, "orderd_rebuild_streams_done", name)
			if running != 1 || events == 0 || events >= float64(len(f.Flat)) || streams == 0 {
				return fmt.Errorf("running %v, events %v of %d, streams %v", running, events, len(f.Flat), streams)
			}
			return nil
		})
		job = k.waitJob(t, ctx, job.ID, 30*time.Second)
		if job.State != jobs.StateSucceeded {
			t.Fatalf("rebuild %d: %s %s", round, job.State, job.Error)
		}
		if job.Partitions != 2 {
			t.Errorf("rebuild %d: %d partitions, want 2", round, job.Partitions)
		}
		// The finish task's deferred bookkeeping runs just after the job
		// is marked succeeded.
		projectiontest.WaitFor(t, 10*time.Second, "orderd_rebuild_running back to 0", func() error {
			if v := projectiontest.Metric(t, reg, "orderd_rebuild_running", name); v != 0 {
				return fmt.Errorf("running %v", v)
			}
			return nil
		})
		if got, want := projectiontest.Metric(t, reg, "orderd_rebuild_events_done", name), float64(len(f.Flat)); got != want {
			t.Errorf("rebuild %d: events done %v, want %v (every event once)", round, got, want)
		}
		if got, want := projectiontest.Metric(t, reg, "orderd_rebuild_streams_done", name), float64(len(f.IDs)); got != want {
			t.Errorf("rebuild %d: streams done %v, want %v", round, got, want)
		}
		projectiontest.LogMetrics(t, reg, name)
	}
	// The projections not rebuilt kept their gauges at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 2 {
			t.Errorf("%s: %d series, want 2", g, n)
		}
		for _, other := range []string{projectiontest.CustomerTotals.Name} {
			if v := projectiontest.Metric(t, reg, g, other); v != 0 {
				t.Errorf("%s of %s, never rebuilt: %v", g, other, v)
			}
		}
	}
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
}

// TestRebuildFinishVerifiesTheShadowAgainstTheScansSums holds a rebuild's
// finish back until its partitions have scanned, then changes the shadow
// behind its back: one document deleted, one changed, one added that no
// stream has, one changed whose sum is gone, and one left as scanned whose
// sum is gone (as a batch scanned by a binary that records no sums leaves
// them). The finish, checking the shadow against the sums the scan
// recorded rather than the whole log, finds and repairs each changed
// document, passes the unchanged one, and switches; readers then read the
// fold of the log, and the sums are dropped with the job.
func TestRebuildFinishVerifiesTheShadowAgainstTheScansSums(t *testing.T) {
	ctx, k, f := projectedKit(t, 90*time.Second, "vss", 20, 3)
	db := k.db
	name := projection.OrderSummaries.Name
	job, err := k.jobs.StartRebuild(ctx, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The finish is held by a runner whose lease lasts: no worker claims
	// it until the test ends that lease.
	finish := bson.D{{Key: "_id", Value: job.ID + "/finish"}}
	projectiontest.Must(t)(db.Collection(mongodb.TasksCollection).UpdateOne(ctx, finish, bson.D{{Key: "$set", Value: bson.D{
		{Key: "state", Value: "running"}, {Key: "owner", Value: "holder"}, {Key: "lease_until", Value: time.Now().Add(time.Hour).UTC()}}}}))
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, Grace: time.Hour})
	projectiontest.WaitFor(t, 30*time.Second, "partitions scanned", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		parts := 0
		for _, task := range j.Tasks {
			if task.Name == "plan" || task.Name == "finish" {
				continue
			}
			if task.State != "done" {
				return fmt.Errorf("%s %s", task.Name, task.State)
			}
			parts++
		}
		if parts != 2 {
			return fmt.Errorf("%d partitions", parts)
		}
		return nil
	})
	shadow, sums := db.Collection(job.Shadow), db.Collection(projection.SumsCollection(job.Shadow))
	if n, err := sums.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(f.IDs)) {
		t.Fatalf("sums recorded by the scan: %d, %v; want %d", n, err, len(f.IDs))
	}
	missing, changed, unsummedChanged, unsummed := f.IDs[1], f.IDs[7], f.IDs[12], f.IDs[18]
	projectiontest.Must(t)(shadow.DeleteOne(ctx, bson.D{{Key: "_id", Value: missing}}))
	projectiontest.Must(t)(shadow.UpdateOne(ctx, bson.D{{Key: "_id", Value: changed}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 1}}}}))
	projectiontest.Must(t)(shadow.UpdateOne(ctx, bson.D{{Key: "_id", Value: unsummedChanged}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "approved"}, {Key: "total_cents", Value: 2}}}}))
	projectiontest.Must(t)(shadow.InsertOne(ctx, bson.D{{Key: "_id", Value: "ghost"}, {Key: "version", Value: 1}, {Key: "status", Value: "created"}}))
	projectiontest.Must(t)(sums.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{unsummedChanged, unsummed}}}}}))

	projectiontest.Must(t)(db.Collection(mongodb.TasksCollection).UpdateOne(ctx, finish, bson.D{{Key: "$set", Value: bson.D{
		{Key: "lease_until", Value: time.Now().Add(-time.Second).UTC()}}}}))
	job = k.waitJob(t, ctx, job.ID, 30*time.Second)
	if job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}
	rep := job.Report
	if rep == nil {
		t.Fatal("no verify report")
	}
	// Streams counts the recorded sums: a verify that scanned the log
	// would count every stream.
	if rep.Missing != 1 || rep.Different != 2 || rep.Extra != 1 || rep.Stale != 0 || rep.Repaired != 4 ||
		rep.Streams != int64(len(f.IDs)-2) || rep.Documents != int64(len(f.IDs)) || rep.Events != int64(len(f.Flat)) || rep.Digest == rep.ExpectedDigest {
		t.Errorf("verify before the switch: %+v; want 1 missing, 2 different, 1 extra, 4 repaired, %d streams, %d documents, %d events, unequal digests",
			*rep, len(f.IDs)-2, len(f.IDs), len(f.Flat))
	}
	var found []string
	for _, e := range rep.Examples {
		found = append(found, e.Kind+" "+e.ID)
	}
	slices.Sort(found)
	if want := []string{"different " + changed, "different " + unsummedChanged, "extra ghost", "missing " + missing}; !slices.Equal(found, want) {
		t.Errorf("drift found %v, want %v", found, want)
	}
	ptr, err := k.ps.Get(ctx, name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow {
		t.Fatalf("pointer after the rebuild: %+v, want %s active", ptr, job.Shadow)
	}
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
	reader := mongodb.NewReader(db, k.ps, nil)
	if _, err := reader.Summary(ctx, "ghost"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("the added document after the switch: %v, want not found", err)
	}
	for _, id := range []string{missing, changed, unsummedChanged, unsummed} {
		got, err := reader.Summary(ctx, id)
		if err != nil {
			t.Errorf("summary %s after the switch: %v", id, err)
			continue
		}
		if want := f.Orders[id]; projectiontest.Dump(got) != projectiontest.Dump(want) {
			t.Errorf("summary %s after the switch: %s, want the fold of its log %s", id, projectiontest.Dump(got), projectiontest.Dump(want))
		}
	}
	names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: projection.SumsCollection(job.Shadow)}})
	if err != nil || len(names) != 0 {
		t.Errorf("sums after the rebuild succeeded: %v %v, want dropped", names, err)
	}
	// And on the drop list, should a late batch write them again.
	if err := db.Collection(mongodb.RetiredCollection).FindOne(ctx, bson.D{{Key: "_id", Value: projection.SumsCollection(job.Shadow)}}).Err(); err != nil {
		t.Errorf("sums on the drop list: %v", err)
	}
}

// TestWorkerTakesEachTaskWithoutPolling: a worker that looks for tasks
// only once an hour still runs jobs through as soon as it may: it takes
// a job's first task when the job is created in its process, a rebuild's
// partitions when the settling time ends, and the next task when one of
// its own ends. (The first rebuild may be found by the worker's first
// look; the next jobs come once it waits.)
func TestWorkerTakesEachTaskWithoutPolling(t *testing.T) {
	ctx, k, f := projectedKit(t, 90*time.Second, "nop", 6, 2)
	k.worker(t, "w1", jobs.WorkerConfig{Poll: time.Hour, Settle: 300 * time.Millisecond})
	name := projection.OrderSummaries.Name
	for _, partitions := range []int{1, 2} {
		job, err := k.jobs.StartRebuild(ctx, name, partitions)
		if err != nil {
			t.Fatal(err)
		}
		if job = k.waitJob(t, ctx, job.ID, 30*time.Second); job.State != jobs.StateSucceeded {
			t.Fatalf("rebuild in %d partitions: %s %s", partitions, job.State, job.Error)
		}
	}
	job, err := k.jobs.StartVerify(ctx, name, false)
	if err != nil {
		t.Fatal(err)
	}
	if job = k.waitJob(t, ctx, job.ID, 30*time.Second); job.State != jobs.StateSucceeded || job.Report == nil || job.Report.Drift() != 0 {
		t.Fatalf("verify: %s %s %+v", job.State, job.Error, job.Report)
	}
	if err := projectiontest.DiffReadModels(ctx, k.db, f, true); err != nil {
		t.Error(err)
	}
}
