package projector_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/internal/tcpproxy"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// TestRunnerEndToEnd runs the whole path on real servers: commands through
// domain.Service append to the log, the Relay publishes to JetStream, two
// "processes" (own store client, own NATS connection) share the partitions
// of order_summaries and one runs customer_order_stats. Once the commands
// are done, the consumers' lag drains to 0 and every read-model document
// equals the fold of the log.
func TestRunnerEndToEnd(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)

	relayLog(t, es, db, b, log)

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
	sums2 := projector.NewRunner(sumsStore2, bustest.ConnectTo(t, b.URL), mongodb.NewDeadLetters(db2), cfg2, log, m)
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
	cache, _ := lru.New[string, domain.Order](orders)
	svc := domain.NewService(es, cache)
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
	ctx, b, db, es := projectortest.Start(t, 80*time.Second)
	f := projectiontest.NewFixture(t, ctx, es, "dup", 20, 4)
	total := float64(len(f.Flat))

	for _, e := range reversed(f.Flat) {
		b.PublishEvents(t, ctx, []domain.Event{e}, "")
		b.PublishEvents(t, ctx, []domain.Event{e}, "copy-")
	}

	reg := prometheus.NewRegistry()
	pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
	cfg := b.RunnerConfig()
	sums := projectortest.Run(t, b, db, mongodb.NewProjection(db, projection.OrderSummaries, es, pm, mongodb.NewPointers(db)), cfg, m)
	stats := projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, pm, mongodb.NewPointers(db)), cfg, m)

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
	b.PublishEvents(t, ctx, reversed(f.Flat), "again-")
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
	ctx, b, db, es := projectortest.Start(t, 60*time.Second)
	g := newGapped(t, ctx, b, db, es, b.RunnerConfig())
	es, reg, dead, r, gapV2 := g.es, g.reg, g.dead, g.r, g.v2
	projectiontest.AppendStream(t, ctx, es, "healthy", projectiontest.Lifecycle(0, "cust-h"), 2, g.at)
	healthy := projectiontest.LoadFixture(t, ctx, es, []string{"healthy"})

	teleported := []byte(`{"event_id":"x1","stream_id":"o1","stream_type":"order","type":"OrderTeleported","version":1,` +
		`"occurred_at":"2024-07-01T12:00:00Z","recorded_at":"2024-07-01T12:00:00Z","data":{},"metadata":{"schema_version":1}}`)
	b.Publish(t, ctx, "o1", teleported, "x1")
	// v2 of a stream whose log holds only v1: a gap the log cannot fill.
	b.PublishEvents(t, ctx, []domain.Event{gapV2}, "")
	b.PublishEvents(t, ctx, healthy.Flat, "")

	reader := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
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
	ctx, b, db, es := projectortest.Start(t, 60*time.Second)
	cfg := b.RunnerConfig()
	g := newGapped(t, ctx, b, db, es, cfg)
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
	b.PublishEvents(t, ctx, []domain.Event{g.v2}, "")
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
	ctx, b, db, es := projectortest.Start(t, 60*time.Second)
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
	ps := mongodb.NewPointers(db)
	sums := projectortest.Run(t, b, db, mongodb.NewProjection(db, projection.OrderSummaries, es, nil, ps), cfg, nil)
	stats := projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, ps), cfg, nil)

	// Only v3 of the newer stream reaches this build: a gap, filled from
	// the log. The healthy streams' events come before and after it.
	half := len(healthy.Flat) / 2
	b.PublishEvents(t, ctx, healthy.Flat[:half], "")
	b.PublishEvents(t, ctx, []domain.Event{v3}, "")
	b.PublishEvents(t, ctx, healthy.Flat[half:], "")

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
	if _, err := mongodb.NewReader(db, ps, nil).Summary(ctx, newer); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("summary of the parked stream: %v, want ErrNotFound", err)
	}
}

// TestRunnerPartitionsRebalance runs order_summaries in "processes" (own
// NATS connection, own Projection and document cache) sharing its four
// partitions through JetStream's pins: A alone is given all four; B joins,
// A gives two back and B is given them; A stops and B is given all four.
// After each step the read model reaches the fold of the log, and B
// applies events once it holds partitions.
func TestRunnerPartitionsRebalance(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)

	proc := func(owner string) (*projector.Runner, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
		cfg := b.RunnerConfig()
		cfg.Owner = owner
		p := mongodb.NewProjection(db, projection.OrderSummaries, es, pm, mongodb.NewPointers(db))
		return projector.NewRunner(p, bustest.ConnectTo(t, b.URL), mongodb.NewDeadLetters(db), cfg, log, m), reg
	}
	a, _ := proc("A")
	bRunner, regB := proc("B")
	projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)

	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	svc := domain.NewService(es, nil)
	var ids []string
	ids = driveUntilOwners(t, ctx, svc, a, "part", ids, map[string]int{"A": 4})
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold while A holds every partition", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	projectiontest.Go(t, "runner B", bRunner.Run)
	ids = driveUntilOwners(t, ctx, svc, a, "part", ids, map[string]int{"A": 2, "B": 2})
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
	ids = driveUntilOwners(t, ctx, svc, bRunner, "part", ids, map[string]int{"B": 4})
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after B was given every partition", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	projectortest.WaitLag(t, ctx, 15*time.Second, bRunner)
	// B's metrics, by partition: it holds all four, exposes each one's lag,
	// and its per-partition applied counters add up to its total.
	projectiontest.WaitFor(t, 10*time.Second, "B's metrics of its four partitions", func() error {
		if n := projectiontest.Metric(t, regB, "orderd_projection_partitions_owned", "order_summaries"); n != 4 {
			return fmt.Errorf("B: partitions owned %v, want 4", n)
		}
		if n := projectiontest.Series(t, regB, "orderd_projection_partition_lag"); n != 4 {
			return fmt.Errorf("B exposes the lag of %d partitions, want its 4", n)
		}
		return nil
	})
	byPart := map[string]float64{}
	for _, mf := range projectiontest.MustGather(t, regB) {
		for _, m := range mf.GetMetric() {
			if mf.GetName() != "orderd_projection_partition_events_applied_total" {
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" {
					byPart[l.GetValue()] += m.GetCounter().GetValue()
				}
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
}

// TestRunnerTakesOverFromAProcessCutOffTheBus: a partition holder whose
// NATS connection is gone sends no pull request, so JetStream unpins its
// partitions after PinnedTTL; the healthy member, alone at the roll call,
// pulls every partition, is given them and applies what was written
// meanwhile.
func TestRunnerTakesOverFromAProcessCutOffTheBus(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 90*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)

	proc := func(owner string, js jetstream.JetStream) *projector.Runner {
		cfg := b.RunnerConfig()
		cfg.Owner = owner
		p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
		return projector.NewRunner(p, js, mongodb.NewDeadLetters(db), cfg, log, nil)
	}
	// A reaches NATS through a proxy the test cuts: A's connection then
	// stays open and reconnecting, as when the network between them fails.
	cut := tcpproxy.New(t, "127.0.0.1:0", strings.TrimPrefix(b.URL, "nats://"))
	jsA := bustest.ConnectTo(t, "nats://"+cut.Addr)
	a := proc("A", jsA)
	projectiontest.Go(t, "runner A", a.Run)
	svc := domain.NewService(es, nil)
	ids := driveUntilOwners(t, ctx, svc, a, "cut", nil, map[string]int{"A": 4})
	bRunner := proc("B", bustest.ConnectTo(t, b.URL))
	projectiontest.Go(t, "runner B", bRunner.Run)
	ids = driveUntilOwners(t, ctx, svc, bRunner, "cut", ids, map[string]int{"A": 2, "B": 2})
	projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)

	cut.Close()
	ids = driveUntilOwners(t, ctx, svc, bRunner, "cut", ids, map[string]int{"B": 4})
	f := projectiontest.LoadFixture(t, ctx, es, ids)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after B was given A's partitions", func() error {
		return projectiontest.DiffReadModels(ctx, db, f, true)
	})
}

// TestRunnerPartitionConsumerFailureStaysItsOwn: when one partition's
// consumer fails (here it is deleted under its worker, whose iterator
// then closes), that partition's worker starts again on a consumer
// created anew, while the other partitions go on: Run does not return,
// and the read model reaches the fold.
func TestRunnerPartitionConsumerFailureStaysItsOwn(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 90*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)
	cfg := b.RunnerConfig()
	cfg.Owner = "A"
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	r := projector.NewRunner(p, b.JS, mongodb.NewDeadLetters(db), cfg, log, nil)
	projectiontest.Go(t, "runner A", r.Run)
	projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	svc := domain.NewService(es, nil)
	ids := driveUntilOwners(t, ctx, svc, r, "one", nil, map[string]int{"A": 4})
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	if err := b.JS.DeleteConsumer(ctx, b.Stream.Name, r.ConsumerName(1)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, writeOrders(t, ctx, svc, "two", 0, 16)...)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold after partition 1's consumer was deleted", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if _, err := b.JS.Consumer(ctx, b.Stream.Name, r.ConsumerName(1)); err != nil {
		t.Errorf("partition 1's consumer after its worker started again: %v", err)
	}
}

// TestRunnerWritesThroughAStoreStall: the projector's link to the store
// stalls (a TCP proxy holds every byte it sends, as a replica set without
// a primary answers nothing for an election's 10-12 s) for longer than
// the pinned TTL, while commands go on through another link. The stalled
// batch, and what waits behind it, is written once the link is back; the
// read model then equals the fold, and the process still holds its
// partitions.
func TestRunnerWritesThroughAStoreStall(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)

	c, proxy := storetest.HeldClient(t)
	pdb := c.Database(db.Name())
	cfg := b.RunnerConfig()
	cfg.Owner = "P"
	p := mongodb.NewProjection(pdb, projection.OrderSummaries, mongodb.NewEventStore(pdb), nil, mongodb.NewPointers(pdb))
	r := projector.NewRunner(p, bustest.ConnectTo(t, b.URL), mongodb.NewDeadLetters(pdb), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	// The other read model, on a link that does not stall.
	projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)

	svc := domain.NewService(es, nil)
	ids := driveUntilOwners(t, ctx, svc, r, "stall", nil, map[string]int{"P": cfg.Partitions})
	projectiontest.WaitFor(t, 30*time.Second, "the read model before the stall", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	proxy.Hold()
	ids = append(ids, writeOrders(t, ctx, svc, "held", 0, 8)...)
	time.Sleep(2 * cfg.PinnedTTL) // the fault's length, not a wait for an outcome
	proxy.Release()

	projectiontest.WaitFor(t, 60*time.Second, "the read model after the stall", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	driveUntilOwners(t, ctx, svc, r, "after", nil, map[string]int{"P": cfg.Partitions})
}

// TestRunnerRetiresVersionsNothingUses: after a rolling upgrade from
// version 1 to version 2 of a projection, version 1's consumers stay
// while the pointer still names its collection (the grace after the
// switch, when a switch back may need it), and are deleted by a version 2
// runner once the pointer names none and no version 1 process answers
// its roll call. Version 2's own are kept.
func TestRunnerRetiresVersionsNothingUses(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)
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
	run := func(def projection.Definition[domain.Order], owner string) (*projector.Runner, func()) {
		t.Helper()
		cfg := b.RunnerConfig()
		cfg.Owner = owner
		r := projector.NewRunner(mongodb.NewProjection(db, def, es, nil, mongodb.NewPointers(db)), b.JS, mongodb.NewDeadLetters(db), cfg, log, nil)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		projectiontest.WaitFor(t, 20*time.Second, owner+" answers its roll call", func() error {
			ms, err := projector.RollCall(ctx, b.JS.Conn(), r.Key())
			if err == nil && len(ms) == 0 {
				err = errors.New("no member")
			}
			return err
		})
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
	if n := consumers(old); n != old.Partitions() {
		t.Fatalf("in the grace: version 1 has %d consumers; want all %d kept", n, old.Partitions())
	}
	stopCur()
	// The grace is over: the pointer names version 1 no more.
	point(func(p *projection.Pointer) { p.Previous, p.PreviousVersion = "", 0 })
	_, stopCur = run(v2, "new")
	defer stopCur()
	projectiontest.WaitFor(t, 30*time.Second, "version 1's consumers deleted", func() error {
		if n := consumers(old); n != 0 {
			return fmt.Errorf("version 1 has %d consumers", n)
		}
		return nil
	})
	if n := consumers(cur); n != cur.Partitions() {
		t.Errorf("version 2 has %d consumers; want all %d", n, cur.Partitions())
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
	ctx, b, db, es := projectortest.Start(t, 120*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)

	c, store := storetest.HeldClient(t)
	pdb := c.Database(db.Name())
	link := tcpproxy.New(t, "127.0.0.1:0", strings.TrimPrefix(b.URL, "nats://"))
	var slow, reconnects atomic.Int64
	js := bustest.ConnectTo(t, "nats://"+link.Addr,
		nats.ReconnectHandler(func(*nats.Conn) { reconnects.Add(1) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				slow.Add(1)
			}
		}))
	cfg := b.RunnerConfig()
	cfg.Owner, cfg.BatchSize, cfg.AckWait = "P", 8, 5*time.Minute
	p := mongodb.NewProjection(pdb, projection.OrderSummaries, mongodb.NewEventStore(pdb), nil, mongodb.NewPointers(pdb))
	r := projector.NewRunner(p, js, mongodb.NewDeadLetters(pdb), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", r.Run)
	projectortest.Run(t, b, db, mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)), b.RunnerConfig(), nil)
	svc := domain.NewService(es, nil)
	ids := driveUntilOwners(t, ctx, svc, r, "first", nil, map[string]int{"P": cfg.Partitions})

	consumers := func() []*jetstream.ConsumerInfo { return consumerInfos(t, ctx, b, r) }
	store.Hold()
	ids = append(ids, writeOrders(t, ctx, svc, "cut", 0, 40)...)
	// A batch in the stalled write, and the pull's buffer behind it.
	projectiontest.WaitFor(t, 60*time.Second, "every partition's messages piled up", func() error {
		for _, info := range consumers() {
			if info.NumAckPending < 2 {
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
