package projector_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
	"github.com/orderd/orderd/projector"
	"github.com/orderd/orderd/projector/projectortest"
)

// TestRunnerEndToEnd runs the whole path on real servers: commands through
// domain.Service append to the log, the Relay publishes to JetStream, two
// "processes" (own store client, own NATS connection) share the partitions
// of order_summaries and one runs customer_order_stats. Once the commands
// are done, the consumers' lag drains to 0 and every read-model document
// equals the fold of the log.
func TestRunnerEndToEnd(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)

	es := relayedLog(t, ctx, db, b, log)

	reg := prometheus.NewRegistry()
	pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
	cfg := b.RunnerConfig()
	sumsStore := mongodb.NewProjection(db, projection.OrderSummaries, es, pm, mongodb.NewPointers(db))
	cfg1, cfg2 := cfg, cfg
	cfg1.Owner, cfg2.Owner = "p1", "p2"
	sums1 := projector.NewRunner(sumsStore, b.JS, mongodb.NewDeadLetters(db), cfg1, log, m)
	stats := projector.NewRunner(mongodb.NewProjection(db, projectiontest.CustomerTotals, es, pm, mongodb.NewPointers(db)), b.JS, mongodb.NewDeadLetters(db), cfg, log, m)
	// The second runner: its own NATS connection and its own store client,
	// as a second process.
	db2 := storetest.Client(t).Database(db.Name())
	sumsStore2 := mongodb.NewProjection(db2, projection.OrderSummaries, mongodb.NewEventStore(db2), pm, mongodb.NewPointers(db2))
	sums2 := projector.NewRunner(sumsStore2, b.Connect(t), mongodb.NewDeadLetters(db2), cfg2, log, m)
	projectiontest.Go(t, "summaries runner 1", sums1.Run)
	projectiontest.Go(t, "summaries runner 2", sums2.Run)
	projectiontest.Go(t, "stats runner", stats.Run)

	// Orders driven concurrently by 8 clients, one command at a time: 100
	// on an external MongoDB, 30 on the embedded FerretDB, which runs in
	// this process under the race detector and decodes every document in
	// Go (100 orders take minutes there with -race on two cores).
	const clients = 8
	orders := 30
	if os.Getenv("MONGODB_URI") != "" {
		orders = 100
	}
	ids := make([]string, orders)
	jobs := make(chan int, orders)
	for i := range orders {
		ids[i] = fmt.Sprintf("e2e%03d", i)
		jobs <- i
	}
	close(jobs)
	// A state cache spares each command the read of its stream, as the
	// service binary does.
	svc := domain.NewService(es, domaintest.NewMapCache())
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for i := range jobs {
				for _, cmd := range commands(i, fmt.Sprintf("cust-%d", i%7)) {
					if _, err := svc.Execute(ctx, ids[i], cmd, domain.ExecOptions{}); err != nil {
						t.Errorf("%s %s: %v", domain.CommandName(cmd), ids[i], err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("commands done in %s", time.Since(start))
	f := projectiontest.LoadFixture(t, ctx, es, ids)
	t.Logf("%d orders, %d events appended", len(ids), len(f.Flat))

	// Poll the cheap signals (the stream holds every event, every consumer
	// acknowledged everything) before comparing documents.
	projectiontest.WaitFor(t, 45*time.Second, "every event published and acknowledged", func() error {
		if n := b.Messages(t, ctx); n < uint64(len(f.Flat)) {
			return fmt.Errorf("%d of %d events on the stream", n, len(f.Flat))
		}
		for _, r := range []*projector.Runner{sums1, sums2, stats} {
			if n, err := r.Lag(ctx); err != nil || n != 0 {
				return fmt.Errorf("%s: lag %d (%v)", r.Name(), n, err)
			}
		}
		return nil
	})
	t.Logf("published and acknowledged %s after the commands started", time.Since(start))
	projectiontest.WaitFor(t, 10*time.Second, "read models equal to the fold of the log", func() error { return projectiontest.DiffReadModels(ctx, db, f, true) })
	if dl, err := mongodb.NewDeadLetters(db).List(ctx, "", 10); err != nil || len(dl) != 0 {
		t.Errorf("dead letters %v (%v), want none", dl, err)
	}
	for _, name := range []string{projection.OrderSummaries.Name, projectiontest.CustomerTotals.Name} {
		// Every event is counted once applied or, when a write cut off by a
		// lost lease landed all the same, as a duplicate by the partition's
		// next owner; on a busy machine leases are lost.
		applied := projectiontest.Metric(t, reg, "orderd_projection_events_applied_total", name)
		skipped := projectiontest.Metric(t, reg, "orderd_projection_duplicates_skipped_total", name)
		if applied+skipped < float64(len(f.Flat)) {
			t.Errorf("%s: %v events applied and %v skipped as duplicates, want at least %d in all", name, applied, skipped, len(f.Flat))
		}
		projectiontest.LogMetrics(t, reg, name)
	}
}

// TestRunnerDuplicatedAndReorderedDelivery injects on purpose what the
// relay and JetStream may do: every event delivered twice (a republish
// after the de-duplication window, so a different Nats-Msg-Id) and in
// reverse order, queued before the runners start so that copies share a
// batch; later the whole log once more. The read models end equal to the
// fold, and the second round is all skipped duplicates.
func TestRunnerDuplicatedAndReorderedDelivery(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 80*time.Second)
	es := projectiontest.NewLog(t, ctx, db)
	f := projectiontest.NewFixture(t, ctx, es, "dup", 20, 4)
	total := float64(len(f.Flat))

	for _, e := range reversed(f.Flat) {
		b.PublishEvents(t, ctx, []domain.Event{e}, projectortest.EventID)
		b.PublishEvents(t, ctx, []domain.Event{e}, func(e domain.Event) string { return "copy-" + e.ID })
	}

	reg := prometheus.NewRegistry()
	pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
	cfg := b.RunnerConfig()
	// One worker per projection: this test is about delivery, not about
	// writers racing (TestStoreApplyRacingWriters, TestRunnerEndToEnd).
	cfg.Workers = 1
	sums := projectortest.Run(t, b, mongodb.NewProjection(db, projection.OrderSummaries, es, pm, mongodb.NewPointers(db)), cfg, m)
	stats := projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, pm, mongodb.NewPointers(db)), cfg, m)

	projectiontest.WaitFor(t, 20*time.Second, "read models equal to the fold after duplicated, reversed delivery", func() error {
		return projectiontest.DiffReadModels(ctx, db, f, true)
	})
	projectortest.WaitLag(t, ctx, 15*time.Second, sums, stats)

	applied, dups := map[string]float64{}, map[string]float64{}
	names := []string{sums.Name(), stats.Name()}
	for _, n := range names {
		applied[n] = projectiontest.Metric(t, reg, "orderd_projection_events_applied_total", n)
		dups[n] = projectiontest.Metric(t, reg, "orderd_projection_duplicates_skipped_total", n)
	}

	// The whole log again, reversed, under new message ids.
	b.PublishEvents(t, ctx, reversed(f.Flat), func(e domain.Event) string { return "again-" + e.ID })
	// A copy with a remembered id is dropped by the stream itself.
	body, err := domain.MarshalEvent(f.Flat[0])
	if err != nil {
		t.Fatal(err)
	}
	if ack := b.Publish(t, ctx, f.Flat[0].StreamID, body, f.Flat[0].ID); !ack.Duplicate {
		t.Errorf("a republish under the same Nats-Msg-Id inside the window was stored (seq %d), want dropped", ack.Sequence)
	}
	projectortest.WaitLag(t, ctx, 20*time.Second, sums, stats)
	for _, n := range names {
		if d := projectiontest.Metric(t, reg, "orderd_projection_duplicates_skipped_total", n) - dups[n]; d < total {
			t.Errorf("%s: %v duplicates skipped for %v redelivered events", n, d, total)
		}
		if a := projectiontest.Metric(t, reg, "orderd_projection_events_applied_total", n) - applied[n]; a != 0 {
			t.Errorf("%s: %v events applied again, want 0", n, a)
		}
	}
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Fatal(err)
	}
}

// TestRunnerDeadLetters: a message that does not decode and an event whose
// gap the log cannot fill are redelivered, then parked after MaxDeliveries
// with their error, while a healthy order published after them is
// projected. Retry heals a dead letter once its cause is fixed (the missing
// event appended to the log) and keeps one that still fails.
func TestRunnerDeadLetters(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 60*time.Second)
	g := newGapped(t, ctx, b, db, b.RunnerConfig())
	es, reg, dead, r, gapV2 := g.es, g.reg, g.dead, g.r, g.v2
	projectiontest.AppendStream(t, ctx, es, "healthy", projectiontest.Lifecycle(0, "cust-h"), 2, g.at)
	healthy := projectiontest.LoadFixture(t, ctx, es, []string{"healthy"})

	teleported := []byte(`{"event_id":"x1","stream_id":"o1","stream_type":"order","type":"OrderTeleported","version":1,` +
		`"occurred_at":"2024-07-01T12:00:00Z","recorded_at":"2024-07-01T12:00:00Z","data":{},"metadata":{"schema_version":1}}`)
	b.Publish(t, ctx, "o1", teleported, "x1")
	// v2 of a stream whose log holds only v1: a gap the log cannot fill.
	b.PublishEvents(t, ctx, []domain.Event{gapV2}, projectortest.EventID)
	b.PublishEvents(t, ctx, healthy.Flat, projectortest.EventID)

	reader := mongodb.NewReader(db, mongodb.NewPointers(db))
	projectiontest.WaitFor(t, 20*time.Second, "healthy order projected behind the poison", func() error {
		got, err := reader.Summary(ctx, "healthy")
		if err == nil && !reflect.DeepEqual(got, healthy.Orders["healthy"]) {
			err = fmt.Errorf("summary %s, want %s", projectiontest.Dump(got), projectiontest.Dump(healthy.Orders["healthy"]))
		}
		return err
	})
	var letters []projector.DeadLetter
	projectiontest.WaitFor(t, 20*time.Second, "two dead letters", func() error {
		var err error
		letters, err = dead.List(ctx, r.Name(), 10)
		if err == nil && len(letters) != 2 {
			err = fmt.Errorf("%d dead letters: %+v", len(letters), letters)
		}
		return err
	})
	projectortest.WaitLag(t, ctx, 15*time.Second, r)

	var undecodable, gap projector.DeadLetter
	for _, d := range letters {
		switch d.StreamID {
		case "o1":
			undecodable = d
		case "gapped":
			gap = d
		}
	}
	if !strings.HasPrefix(undecodable.ID, r.Name()+":seq-") || undecodable.Payload != string(teleported) ||
		!partitioned(undecodable.Subject, "o1") || !strings.Contains(undecodable.Error, "OrderTeleported") ||
		undecodable.Deliveries < 2 || undecodable.Projection != r.Name() || undecodable.ParkedAt.IsZero() {
		t.Errorf("dead letter of the undecodable message: %+v", undecodable)
	}
	if gap.ID != r.Name()+":"+gapV2.ID || gap.EventID != gapV2.ID || gap.Version != 2 || gap.Deliveries < 2 ||
		!strings.Contains(gap.Error, "does not hold v2") || !partitioned(gap.Subject, "gapped") {
		t.Errorf("dead letter of the unfillable gap: %+v", gap)
	}
	if n, err := dead.Count(ctx, r.Name()); err != nil || n != 2 {
		t.Errorf("Count = %d (%v), want 2", n, err)
	}
	if n := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 2 {
		t.Errorf("dead letters metric %v, want 2", n)
	}
	if _, err := reader.Summary(ctx, "gapped"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("summary of the parked stream: %v, want ErrNotFound", err)
	}

	// Retry before the cause is fixed: still failing, kept, with the result.
	if err := r.Retry(ctx, gap.ID); err == nil || errors.Is(err, domain.ErrNotFound) {
		t.Errorf("Retry of the unfixed gap: %v, want the apply error", err)
	}
	// Fix the cause: the log gets the missing event. Retry folds it.
	g.fill(t, ctx)
	if err := r.Retry(ctx, gap.ID); err != nil {
		t.Fatalf("Retry of the fixed gap: %v", err)
	}
	fixed := projectiontest.LoadFixture(t, ctx, es, []string{"gapped"})
	if got, err := reader.Summary(ctx, "gapped"); err != nil || got.Version != 2 || got.Status != domain.StatusApproved ||
		!reflect.DeepEqual(got, fixed.Orders["gapped"]) {
		t.Errorf("summary of the retried stream: %s (%v), want %s", projectiontest.Dump(got), err, projectiontest.Dump(fixed.Orders["gapped"]))
	}

	// The undecodable message cannot be healed: Retry fails and records it.
	if err := r.Retry(ctx, undecodable.ID); err == nil || errors.Is(err, domain.ErrNotFound) {
		t.Errorf("Retry of the undecodable message: %v, want a decode error", err)
	}
	letters, err := dead.List(ctx, r.Name(), 10)
	if err != nil || len(letters) != 1 || letters[0].ID != undecodable.ID {
		t.Fatalf("dead letters after the retries: %+v (%v), want only %s", letters, err, undecodable.ID)
	}
	if letters[0].RetryResult == "" || letters[0].RetriedAt.IsZero() {
		t.Errorf("failed retry not recorded: %+v", letters[0])
	}

	for _, id := range []string{r.Name() + ":no-such-event", projectiontest.CustomerTotals.Name + ":" + gapV2.ID, "nonsense"} {
		if err := r.Retry(ctx, id); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("Retry(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

// TestDeadLettersMetric: orderd_projection_dead_letters follows the number
// of dead letters parked now: 1 once an event whose gap the log cannot fill
// is parked, 0 again once a retry has healed it (unlike the counter
// orderd_projection_dead_letters_total, which stays at 1).
func TestDeadLettersMetric(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 60*time.Second)
	cfg := b.RunnerConfig()
	cfg.LagInterval = 100 * time.Millisecond
	g := newGapped(t, ctx, b, db, cfg)
	reg, r := g.reg, g.r

	gauge := func(want float64) func() error {
		return func() error {
			if n := projectiontest.Series(t, reg, "orderd_projection_dead_letters_parked"); n != 1 {
				return fmt.Errorf("%d series of orderd_projection_dead_letters, want 1", n)
			}
			if v := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_parked", r.Name()); v != want {
				return fmt.Errorf("orderd_projection_dead_letters %v, want %v", v, want)
			}
			return nil
		}
	}
	projectiontest.WaitFor(t, 10*time.Second, "dead letters gauge sampled at 0", gauge(0))
	// The counters exist from the start, at 0, so their first increase
	// shows in rate() and increase().
	for _, c := range []string{"orderd_projection_events_applied_total", "orderd_projection_duplicates_skipped_total",
		"orderd_projection_gaps_filled_total", "orderd_projection_writes_superseded_total", "orderd_projection_dead_letters_total",
		"orderd_projection_errors_total"} {
		if n := projectiontest.Series(t, reg, c); n != 1 {
			t.Errorf("%s before any event: %d series, want 1", c, n)
		}
	}

	// v2 of a stream whose log holds only v1: parked after two deliveries.
	b.PublishEvents(t, ctx, []domain.Event{g.v2}, projectortest.EventID)
	projectiontest.WaitFor(t, 20*time.Second, "dead letters gauge at 1", gauge(1))
	if n := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
		t.Errorf("orderd_projection_dead_letters_total %v, want 1", n)
	}

	// Fix the cause and retry: the dead letter is gone, and so is the
	// gauge's count; the counter keeps its history.
	g.fill(t, ctx)
	if err := r.Retry(ctx, r.Name()+":"+g.v2.ID); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	projectiontest.WaitFor(t, 10*time.Second, "dead letters gauge back at 0", gauge(0))
	if n := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
		t.Errorf("orderd_projection_dead_letters_total %v after the retry, want 1", n)
	}
}

// TestRunnerParksStreamWhoseLogCannotBeDecoded: a newer writer (a rolling
// deploy) has put a commit of an event type this build does not know in
// the log. The gap fill of that stream cannot read it: its message is
// parked after MaxDeliveries instead of being redelivered for ever, and
// the events of the other streams, published around it, are projected.
func TestRunnerParksStreamWhoseLogCannotBeDecoded(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 60*time.Second)
	es := projectiontest.NewLog(t, ctx, db)
	healthy := projectiontest.NewFixture(t, ctx, es, "fine", 6, 2)

	// The stream of the newer writer: v1 as this build writes it, v2 of a
	// type it does not know (inserted raw, as the newer binary stores
	// it), v3 a type it knows.
	at := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	const newer = "newer"
	projectiontest.AppendStream(t, ctx, es, newer, projectiontest.Lifecycle(0, "cust-n")[:1], 1, at)
	projectiontest.Must(t)(db.Collection(mongodb.CommitsCollection).InsertOne(ctx, bson.D{
		{Key: "_id", Value: mongodb.CommitID(newer, 2)}, {Key: "stream_id", Value: newer}, {Key: "stream_type", Value: domain.StreamTypeOrder},
		{Key: "first_version", Value: int64(2)}, {Key: "last_version", Value: int64(2)},
		{Key: "events", Value: bson.A{bson.D{
			{Key: "event_id", Value: newer + "-e2"}, {Key: "type", Value: "OrderRefunded"}, {Key: "version", Value: int64(2)},
			{Key: "occurred_at", Value: at.Add(time.Hour)}, {Key: "recorded_at", Value: at.Add(time.Hour)},
			{Key: "data", Value: bson.D{{Key: "amount_cents", Value: int64(1250)}}},
			{Key: "correlation_id", Value: "corr-" + newer}, {Key: "causation_id", Value: "cmd-newer-2"}, {Key: "schema_version", Value: 1},
		}}},
		{Key: "recorded_at", Value: at.Add(time.Hour)}, {Key: "published", Value: true},
	}))
	v3 := projectiontest.NewEvent(newer, 3, domain.OrderApproved{}, at.Add(2*time.Hour))
	if _, err := es.Append(ctx, domain.Commit{StreamID: newer, StreamType: domain.StreamTypeOrder, ExpectedVersion: 2,
		Events: []domain.Event{v3}}); err != nil {
		t.Fatal(err)
	}

	dead := mongodb.NewDeadLetters(db)
	cfg := b.RunnerConfig()
	cfg.MaxDeliveries = 2
	cfg.Workers = 1 // about poison, not about writers racing
	ps := mongodb.NewPointers(db)
	sums := projectortest.Run(t, b, mongodb.NewProjection(db, projection.OrderSummaries, es, nil, ps), cfg, nil)
	stats := projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, ps), cfg, nil)

	// Only v3 of the newer stream reaches this build: a gap, filled from
	// the log. The healthy streams' events come before and after it.
	half := len(healthy.Flat) / 2
	b.PublishEvents(t, ctx, healthy.Flat[:half], projectortest.EventID)
	b.PublishEvents(t, ctx, []domain.Event{v3}, projectortest.EventID)
	b.PublishEvents(t, ctx, healthy.Flat[half:], projectortest.EventID)

	for _, r := range []*projector.Runner{sums, stats} {
		projectiontest.WaitFor(t, 20*time.Second, r.Name()+": the newer stream's event parked", func() error {
			letters, err := dead.List(ctx, r.Name(), 10)
			if err != nil {
				return err
			}
			if len(letters) != 1 || letters[0].ID != r.Name()+":"+v3.ID {
				return fmt.Errorf("dead letters %+v, want only %s", letters, v3.ID)
			}
			if d := letters[0]; d.StreamID != newer || d.Version != 3 || d.Deliveries < 2 || !strings.Contains(d.Error, "OrderRefunded") ||
				!strings.Contains(d.Error, domain.ErrUnreadableCommit.Error()) {
				return fmt.Errorf("dead letter %+v: not the gap fill that cannot read v2", d)
			}
			return nil
		})
	}
	projectortest.WaitLag(t, ctx, 15*time.Second, sums, stats)
	if err := projectiontest.DiffReadModels(ctx, db, healthy, true); err != nil {
		t.Error(err)
	}
	if _, err := mongodb.NewReader(db, ps).Summary(ctx, newer); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("summary of the parked stream: %v, want ErrNotFound", err)
	}
}

// TestRunnerPartitionsRebalance runs order_summaries in "processes" (own
// NATS connection, own Projection and document cache) sharing its four
// partitions: A alone holds all four; B joins and each holds two; A stops
// and B holds all four. After each step the read model reaches the fold
// of the log, B applies events once it holds partitions, and no partition
// is ever written by two of them at once.
func TestRunnerPartitionsRebalance(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)
	ts := newOwnerships(t)

	proc := func(owner string) (*projector.Runner, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
		cfg := b.RunnerConfig()
		cfg.Owner, cfg.OnOwnership = owner, ts.hook(owner)
		p := mongodb.NewProjection(db, projection.OrderSummaries, es, pm, mongodb.NewPointers(db))
		return projector.NewRunner(p, b.Connect(t), mongodb.NewDeadLetters(db), cfg, log, m), reg
	}
	a, _ := proc("A")
	bRunner, regB := proc("B")
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)

	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	waitOwners(t, ctx, a, 20*time.Second, map[string]int{"A": 4})
	svc := domain.NewService(es, nil)
	ids := writeOrders(t, ctx, svc, "part", 0, 10)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold while A holds every partition", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	projectiontest.Go(t, "runner B", bRunner.Run)
	waitOwners(t, ctx, a, 30*time.Second, map[string]int{"A": 2, "B": 2})
	ids = append(ids, writeOrders(t, ctx, svc, "part", 10, 20)...)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold with A and B sharing the partitions", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if n := projectiontest.Metric(t, regB, "orderd_projection_events_applied_total", "order_summaries"); n == 0 {
		t.Errorf("B applied nothing while it held two partitions")
	}

	stopA()
	if err := <-aDone; err != nil {
		t.Fatalf("A: %v", err)
	}
	waitOwners(t, ctx, a, 30*time.Second, map[string]int{"B": 4})
	ids = append(ids, writeOrders(t, ctx, svc, "part", 20, 30)...)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after B took every partition", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	projectortest.WaitLag(t, ctx, 15*time.Second, bRunner)
	// B's metrics, by partition: it owns all four, exposes each one's lag,
	// and its per-partition applied counters add up to its total.
	if n := projectiontest.Metric(t, regB, "orderd_projection_partitions_owned", "order_summaries"); n != 4 {
		t.Errorf("B: partitions owned %v, want 4", n)
	}
	byPart := map[string]float64{}
	lags := 0
	for _, mf := range projectiontest.MustGather(t, regB) {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "orderd_projection_partition_events_applied_total":
				byPart[labels["partition"]] += m.GetCounter().GetValue()
			case "orderd_projection_partition_lag":
				lags++
			}
		}
	}
	total := 0.0
	for _, v := range byPart {
		total += v
	}
	if applied := projectiontest.Metric(t, regB, "orderd_projection_events_applied_total", "order_summaries"); total != applied || len(byPart) < 2 {
		t.Errorf("B: applied by partition %v (sum %v), total %v", byPart, total, applied)
	}
	if lags != 4 {
		t.Errorf("B exposes the lag of %d partitions, want its 4", lags)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.starts["A"] < 4 || ts.starts["B"] < 4 {
		t.Errorf("ownerships started: %v, want at least 4 each", ts.starts)
	}
}

// TestRunnerCutOffFromTheBusReleasesPartitions: a partition owner whose
// NATS connection is gone stops renewing its partitions (it would hold
// them still for as long as it lives) and leaves, and a healthy member
// takes them over and applies what was written meanwhile.
func TestRunnerCutOffFromTheBusReleasesPartitions(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 90*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)
	ts := newOwnerships(t)

	proc := func(owner string, js jetstream.JetStream) *projector.Runner {
		cfg := b.RunnerConfig()
		cfg.Owner, cfg.OnOwnership = owner, ts.hook(owner)
		p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
		return projector.NewRunner(p, js, mongodb.NewDeadLetters(db), cfg, log, nil)
	}
	// A reaches NATS through a proxy the test cuts: A's connection then
	// stays open and reconnecting, as when the network between them fails.
	cut := storetest.NewHoldingProxy(t, strings.TrimPrefix(b.URL, "nats://"))
	jsA := projectortest.ConnectTo(t, "nats://"+cut.Addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	a := proc("A", jsA)
	projectiontest.Go(t, "runner A", a.Run)
	waitOwners(t, ctx, a, 20*time.Second, map[string]int{"A": 4})
	projectiontest.Go(t, "runner B", proc("B", b.Connect(t)).Run)
	waitOwners(t, ctx, a, 30*time.Second, map[string]int{"A": 2, "B": 2})
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)

	cut.Cut()
	ids := writeOrders(t, ctx, domain.NewService(es, nil), "cut", 0, 8)
	waitOwners(t, ctx, a, 30*time.Second, map[string]int{"B": 4})
	f := projectiontest.LoadFixture(t, ctx, es, ids)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after B took over", func() error { return projectiontest.DiffReadModels(ctx, db, f, true) })
}

// TestRunnerPartitionConsumerFailureStaysItsOwn: when one partition's
// consumer fails (here it is deleted under its workers, whose iterator
// then closes), that partition's workers start again on a consumer
// created anew, while the other partitions keep their ownerships: Run does
// not return, and no partition is released or claimed again.
func TestRunnerPartitionConsumerFailureStaysItsOwn(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 90*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)
	ts := newOwnerships(t)
	var mu sync.Mutex
	stops := map[int]int{}
	cfg := b.RunnerConfig()
	cfg.Owner = "A"
	hook := ts.hook("A")
	cfg.OnOwnership = func(name string, p int, start bool) {
		hook(name, p, start)
		if !start {
			mu.Lock()
			stops[p]++
			mu.Unlock()
		}
	}
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	r := projector.NewRunner(p, b.JS, mongodb.NewDeadLetters(db), cfg, log, nil)
	projectiontest.Go(t, "runner A", r.Run)
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"A": 4})
	svc := domain.NewService(es, nil)
	ids := writeOrders(t, ctx, svc, "one", 0, 8)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	if err := b.JS.DeleteConsumer(ctx, b.Stream.Name, r.ConsumerName(1)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, writeOrders(t, ctx, svc, "one", 8, 24)...)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after partition 1's consumer was deleted", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if _, err := b.JS.Consumer(ctx, b.Stream.Name, r.ConsumerName(1)); err != nil {
		t.Errorf("partition 1's consumer after its workers started again: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stops) != 0 {
		t.Errorf("ownerships stopped by partition: %v; want none (one partition's consumer failed)", stops)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.starts["A"] != 4 {
		t.Errorf("A started %d ownerships, want its 4 once", ts.starts["A"])
	}
}

// TestRunnerKeepsItsPartitionsThroughAStoreStall: the projector's link to
// the store stalls (a TCP proxy holds every byte it sends, as a replica
// set without a primary answers nothing for an election's 10-12 s) for
// longer than the partition lease, while commands go on through another
// link. The fence stops the owner's writes at LeaseTTL/2, but the owner
// keeps its partitions: no other member could claim them, so the first
// renewal that gets through opens the writes again, and no ownership ends
// (before, the fence ended every ownership and each partition was claimed
// and its consumer started again). The read model then equals the fold.
func TestRunnerKeepsItsPartitionsThroughAStoreStall(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)

	c, proxy := storetest.HeldClient(t)
	pdb := c.Database(db.Name())

	var starts, stops atomic.Int64
	cfg := b.RunnerConfig()
	cfg.Owner, cfg.LeaseTTL = "P", 4*time.Second
	cfg.OnOwnership = func(_ string, _ int, start bool) {
		if start {
			starts.Add(1)
		} else {
			stops.Add(1)
		}
	}
	p := mongodb.NewProjection(pdb, projection.OrderSummaries, mongodb.NewEventStore(pdb), nil, mongodb.NewPointers(pdb))
	r := projector.NewRunner(p, b.Connect(t), mongodb.NewDeadLetters(pdb), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	// The other read model, on a link that does not stall.
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"P": cfg.Partitions})

	svc := domain.NewService(es, nil)
	ids := writeOrders(t, ctx, svc, "stall", 0, 5)
	projectiontest.WaitFor(t, 30*time.Second, "the read model before the stall", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	proxy.Hold()
	ids = append(ids, writeOrders(t, ctx, svc, "stall", 5, 10)...)
	// Held until every partition's lease has expired: a successor could
	// have claimed them all, and the fence has long closed the writes.
	leases := mongodb.NewPartitions(db, r.Key())
	projectiontest.WaitFor(t, 30*time.Second, "every partition lease expired", func() error {
		ls, err := leases.List(ctx, cfg.Partitions)
		if err != nil {
			return err
		}
		for _, l := range ls {
			if l.ExpiresAt.After(time.Now()) {
				return fmt.Errorf("partition lease %s expires at %s", l.Name, l.ExpiresAt.Format(time.RFC3339Nano))
			}
		}
		return nil
	})
	proxy.Release()

	projectiontest.WaitFor(t, 60*time.Second, "the read model after the stall", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if s, e := starts.Load(), stops.Load(); s != int64(cfg.Partitions) || e != 0 {
		t.Errorf("%d ownerships started and %d ended through the stall; want %d started, none ended", s, e, cfg.Partitions)
	}
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"P": cfg.Partitions})
}

// TestRunnerAcknowledgesAgainWhatWasLost: while the acknowledgements a
// projector sends are lost on their way (a proxy drops them, as a
// consumer whose leader is lost or elected loses them), its partitions
// fill MaxAckPending and JetStream delivers nothing more to them. Once
// acknowledgements get through again, the projector's unconfirmed ones are
// sent again and the partitions move on at once: AckWait (five minutes
// here) is never waited out, and the read models equal the fold.
func TestRunnerAcknowledgesAgainWhatWasLost(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)

	dropper := bustest.NewAckDropper(t, strings.TrimPrefix(b.URL, "nats://"))
	cfg := b.RunnerConfig()
	cfg.Owner, cfg.Workers, cfg.BatchSize, cfg.AckWait = "P", 1, 8, 5*time.Minute
	maxAckPending := 4 * cfg.Workers * cfg.BatchSize
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	r := projector.NewRunner(p, projectortest.ConnectTo(t, dropper.URL), mongodb.NewDeadLetters(db), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"P": cfg.Partitions})

	consumers := func() []*jetstream.ConsumerInfo { return consumerInfos(t, ctx, b, r) }
	dropper.Drop(true)
	svc := domain.NewService(es, nil)
	ids := writeOrders(t, ctx, svc, "lost", 0, 40)
	projectiontest.WaitFor(t, 60*time.Second, "a partition stalled at MaxAckPending", func() error {
		for _, info := range consumers() {
			if info.NumAckPending >= maxAckPending {
				return nil
			}
		}
		return fmt.Errorf("no consumer with %d acknowledgements pending (%d dropped)", maxAckPending, dropper.Dropped())
	})
	dropper.Drop(false)
	t.Logf("%d acknowledgements dropped", dropper.Dropped())

	ids = append(ids, writeOrders(t, ctx, svc, "lost", 40, 50)...)
	projectiontest.WaitFor(t, 60*time.Second, "every message acknowledged", func() error {
		for _, info := range consumers() {
			if info.NumAckPending != 0 || info.NumPending != 0 {
				return fmt.Errorf("consumer %s: %d acknowledgements pending, %d messages undelivered", info.Name, info.NumAckPending, info.NumPending)
			}
		}
		return nil
	})
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
}

// TestRunnerRetiresVersionsNothingUses: after a rolling upgrade from
// version 1 to version 2 of a projection, version 1's consumers and
// partition leases stay while the pointer still names its collection (the
// grace after the switch, when a switch back may need it), and are deleted
// by a version 2 runner once the pointer names none and no version 1
// process is alive. Version 2's own are kept.
func TestRunnerRetiresVersionsNothingUses(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)
	v2 := projection.OrderSummaries
	v1 := v2
	v1.Version = 1
	ps := mongodb.NewPointers(db)
	point := func(change func(p *projection.Pointer)) {
		t.Helper()
		if _, err := ps.Update(ctx, v2.Name, v2.Collection, func(p *projection.Pointer) (bool, error) { change(p); return true, nil }); err != nil {
			t.Fatal(err)
		}
	}
	consumers := func(r *projector.Runner) (n int) {
		t.Helper()
		for p := range r.Partitions() {
			_, err := b.JS.Consumer(ctx, b.Stream.Name, r.ConsumerName(p))
			switch {
			case err == nil:
				n++
			case !errors.Is(err, jetstream.ErrConsumerNotFound):
				t.Fatal(err)
			}
		}
		return n
	}
	leases := func(key string) int64 {
		t.Helper()
		n, err := db.Collection(mongodb.PartitionsCollection).CountDocuments(ctx, bson.D{{Key: "projection", Value: key}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	run := func(def projection.Definition[domain.Order], owner string) (*projector.Runner, func()) {
		t.Helper()
		cfg := b.RunnerConfig()
		cfg.Owner = owner
		r := projector.NewRunner(mongodb.NewProjection(db, def, es, nil, mongodb.NewPointers(db)), b.JS, mongodb.NewDeadLetters(db), cfg, log, nil)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		waitOwners(t, ctx, r, 20*time.Second, map[string]int{owner: cfg.Partitions})
		return r, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("runner %s: %v", owner, err)
			}
		}
	}

	point(func(p *projection.Pointer) { p.Active, p.ActiveVersion = v1.Collection, 1 })
	old, stopOld := run(v1, "old")
	stopOld()
	// The upgrade's build switched to version 2; version 1's collection is
	// the previous one, in its grace.
	point(func(p *projection.Pointer) {
		p.Previous, p.PreviousVersion, p.Active, p.ActiveVersion = v1.Collection, 1, v2.Collection+"_v2_x", 2
	})
	cur, stopCur := run(v2, "new")
	if n, k := consumers(old), leases(v1.Key()); n != old.Partitions() || k != int64(old.Partitions()) {
		t.Fatalf("in the grace: version 1 has %d consumers and %d partition leases; want all %d kept", n, k, old.Partitions())
	}
	stopCur()
	// The grace is over: the pointer names version 1 no more.
	point(func(p *projection.Pointer) { p.Previous, p.PreviousVersion = "", 0 })
	_, stopCur = run(v2, "new")
	defer stopCur()
	projectiontest.WaitFor(t, 30*time.Second, "version 1's consumers and leases deleted", func() error {
		if n, k := consumers(old), leases(v1.Key()); n != 0 || k != 0 {
			return fmt.Errorf("version 1 has %d consumers and %d partition leases", n, k)
		}
		return nil
	})
	if n, k := consumers(cur), leases(v2.Key()); n != cur.Partitions() || k != int64(cur.Partitions()) {
		t.Errorf("version 2 has %d consumers and %d partition leases; want all %d", n, k, cur.Partitions())
	}
}

// TestRunnerLosesNoMessageWhenItsBusLinkIsCut: while a projector's
// writes stall (its store link held), its partitions' messages pile up;
// then its NATS link is cut and the client reconnects, and pulls again
// from scratch. The messages that arrive then must find room: a pull
// iterator whose buffer is full drops them ("slow consumer"), and a
// dropped message comes back only after AckWait (five minutes here).
// Every message is handled without waiting that out, and the NATS client
// reports no slow consumer.
func TestRunnerLosesNoMessageWhenItsBusLinkIsCut(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)

	c, store := storetest.HeldClient(t)
	pdb := c.Database(db.Name())
	link := bustest.NewAckDropper(t, strings.TrimPrefix(b.URL, "nats://"))
	var slow, reconnects atomic.Int64
	js := projectortest.ConnectTo(t, link.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				slow.Add(1)
			}
		}))
	cfg := b.RunnerConfig()
	cfg.Owner, cfg.Workers, cfg.BatchSize, cfg.AckWait = "P", 1, 8, 5*time.Minute
	p := mongodb.NewProjection(pdb, projection.OrderSummaries, mongodb.NewEventStore(pdb), nil, mongodb.NewPointers(pdb))
	r := projector.NewRunner(p, js, mongodb.NewDeadLetters(pdb), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"P": cfg.Partitions})

	consumers := func() []*jetstream.ConsumerInfo { return consumerInfos(t, ctx, b, r) }
	svc := domain.NewService(es, nil)
	store.Hold()
	ids := writeOrders(t, ctx, svc, "cut", 0, 40)
	// A batch in the stalled write, and the pull's buffer behind it.
	projectiontest.WaitFor(t, 60*time.Second, "every partition's messages piled up", func() error {
		for _, info := range consumers() {
			if info.NumAckPending < 2*cfg.BatchSize {
				return fmt.Errorf("consumer %s: %d messages delivered and not acknowledged", info.Name, info.NumAckPending)
			}
		}
		return nil
	})
	link.Cut()
	projectiontest.WaitFor(t, 30*time.Second, "the projector's NATS client reconnected", func() error {
		if reconnects.Load() == 0 {
			return errors.New("no reconnect yet")
		}
		return nil
	})
	store.Release()

	ids = append(ids, writeOrders(t, ctx, svc, "cut", 40, 50)...)
	projectiontest.WaitFor(t, 60*time.Second, "every message acknowledged", func() error {
		for _, info := range consumers() {
			if info.NumAckPending != 0 || info.NumPending != 0 {
				return fmt.Errorf("consumer %s: %d acknowledgements pending, %d messages undelivered (%d slow-consumer drops reported)",
					info.Name, info.NumAckPending, info.NumPending, slow.Load())
			}
		}
		return nil
	})
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if n := slow.Load(); n != 0 {
		t.Errorf("the NATS client reported %d slow-consumer drops", n)
	}
}

// TestRunnerKeepsHeldMessagesFromRedelivery: while a projector's writes
// stall for longer than AckWait, the messages pulled and waiting behind
// the stalled batch are marked in progress, so JetStream delivers them
// again no sooner than the stall ends: only the batch in the stalled write
// comes back. Without that, every message held is delivered again each
// AckWait, piling copies into the worker and raising delivery counts
// toward MaxDeliveries. (AckWait is 4 s: the keepalive, every 1.3 s, has
// room to be late on a busy machine.)
func TestRunnerKeepsHeldMessagesFromRedelivery(t *testing.T) {
	ctx, b, db := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	es := relayedLog(t, ctx, db, b, log)

	c, store := storetest.HeldClient(t)
	pdb := c.Database(db.Name())
	cfg := b.RunnerConfig()
	cfg.Owner, cfg.Workers, cfg.BatchSize, cfg.AckWait = "P", 1, 8, 4*time.Second
	p := mongodb.NewProjection(pdb, projection.OrderSummaries, mongodb.NewEventStore(pdb), nil, mongodb.NewPointers(pdb))
	r := projector.NewRunner(p, b.Connect(t), mongodb.NewDeadLetters(pdb), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	projectortest.Run(t, b, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	waitOwners(t, ctx, r, 20*time.Second, map[string]int{"P": cfg.Partitions})

	// Deliveries so far (redeliveries included) and messages delivered
	// and not acknowledged, of the partition consumers.
	counts := func() (delivered uint64, pending []int) {
		t.Helper()
		for _, i := range consumerInfos(t, ctx, b, r) {
			delivered += i.Delivered.Consumer
			pending = append(pending, i.NumAckPending)
		}
		return delivered, pending
	}
	store.Hold()
	ids := writeOrders(t, ctx, domain.NewService(es, nil), "held", 0, 60)
	projectiontest.WaitFor(t, 30*time.Second, "a batch in each stalled write and more waiting", func() error {
		if _, pending := counts(); slices.Min(pending) < 2*cfg.BatchSize {
			return fmt.Errorf("messages delivered and not acknowledged, by partition: %v", pending)
		}
		return nil
	})
	before, pending := counts()
	// Held for three AckWaits: each partition's batch in the write comes
	// back once (its copies then wait, marked in progress, with the
	// others).
	time.Sleep(3 * cfg.AckWait)
	after, _ := counts()
	store.Release()
	if most := uint64(cfg.Partitions * cfg.BatchSize); after-before > most {
		t.Errorf("%d deliveries while the writes stalled for three AckWaits with %v messages held; want at most the stalled batches' %d",
			after-before, pending, most)
	}
	projectiontest.WaitFor(t, 60*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
}
