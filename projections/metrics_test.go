package projections_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/storetest"
	"github.com/orderd/orderd/projections"
)

// TestRebuildMetrics runs rebuilds of two partitions on a Worker with
// metrics: orderd_rebuild_running is 1 while it works and 0 after,
// orderd_rebuild_events_done and orderd_rebuild_streams_done grow during
// the scan and end at the log's totals, and a second rebuild counts
// afresh rather than adding to the first.
func TestRebuildMetrics(t *testing.T) {
	ctx := testContext(t, 90*time.Second)
	k, f := projectedKit(t, ctx, "rbm", 30, 3)
	db := k.db

	reg := prometheus.NewRegistry()
	m := projections.NewMetrics(reg)
	name := projections.OrderSummaries.Name
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := series(t, reg, g); n != 0 {
			t.Errorf("%s before any rebuild: %d series, want none", g, n)
		}
	}
	// Paced, so the scan lasts long enough to be watched: about a second
	// for the fixture's events.
	k.worker(t, "w1", projections.WorkerConfig{BatchStreams: 4, MaxEventsPerSecond: float64(len(f.flat)), Metrics: m})
	// A worker with metrics exposes the gauges of the projections it
	// manages at once, at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := series(t, reg, g); n != 2 {
			t.Errorf("%s once the worker is up: %d series, want 2 (one per projection)", g, n)
		}
	}

	for round := 1; round <= 2; round++ {
		job, err := k.jobs.StartRebuild(ctx, name, 2)
		if err != nil {
			t.Fatal(err)
		}
		// Mid-scan: running, and some but not all of the events counted.
		waitFor(t, 20*time.Second, fmt.Sprintf("rebuild %d under way in the metrics", round), func() error {
			running := metric(t, reg, "orderd_rebuild_running", name)
			events := metric(t, reg, "orderd_rebuild_events_done", name)
			streams := metric(t, reg, "orderd_rebuild_streams_done", name)
			if running != 1 || events == 0 || events >= float64(len(f.flat)) || streams == 0 {
				return fmt.Errorf("running %v, events %v of %d, streams %v", running, events, len(f.flat), streams)
			}
			return nil
		})
		job = k.waitJob(t, ctx, job.ID, 30*time.Second)
		if job.State != projections.StateSucceeded {
			t.Fatalf("rebuild %d: %s %s", round, job.State, job.Error)
		}
		if job.Partitions != 2 {
			t.Errorf("rebuild %d: %d partitions, want 2", round, job.Partitions)
		}
		// The finish task's deferred bookkeeping runs just after the job
		// is marked succeeded.
		waitFor(t, 10*time.Second, "orderd_rebuild_running back to 0", func() error {
			if v := metric(t, reg, "orderd_rebuild_running", name); v != 0 {
				return fmt.Errorf("running %v", v)
			}
			return nil
		})
		if got, want := metric(t, reg, "orderd_rebuild_events_done", name), float64(len(f.flat)); got != want {
			t.Errorf("rebuild %d: events done %v, want %v (every event once)", round, got, want)
		}
		if got, want := metric(t, reg, "orderd_rebuild_streams_done", name), float64(len(f.ids)); got != want {
			t.Errorf("rebuild %d: streams done %v, want %v", round, got, want)
		}
		logMetrics(t, reg, name)
	}
	// The projection not rebuilt kept its gauges at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := series(t, reg, g); n != 2 {
			t.Errorf("%s: %d series, want 2", g, n)
		}
		if v := metric(t, reg, g, projections.CustomerOrderStats.Name); v != 0 {
			t.Errorf("%s of %s, never rebuilt: %v", g, projections.CustomerOrderStats.Name, v)
		}
	}
	if err := diffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
}

// TestDeadLettersMetric: orderd_projection_dead_letters follows the number
// of dead letters parked now: 1 once an event whose gap the log cannot fill
// is parked, 0 again once a retry has healed it (unlike the counter
// orderd_projection_dead_letters_total, which stays at 1).
func TestDeadLettersMetric(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	b := newBus(t, ctx)
	db := storetest.Database(t)
	es := newLog(t, ctx, db)
	at := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	appendStream(t, ctx, es, "gapped", lifecycle(0, "cust-g")[:1], 1, at)

	reg := prometheus.NewRegistry()
	m := projections.NewMetrics(reg)
	dead := projections.NewDeadLetters(db)
	cfg := b.runnerConfig()
	cfg.MaxDeliveries = 2
	cfg.Workers = 1
	cfg.LagInterval = 100 * time.Millisecond
	r := projections.NewRunner(projections.NewProjection(db, projections.OrderSummaries, es, m, projections.NewPointers(db)), b.JS, dead, cfg, testLogger(t), m)
	goRun(t, "summaries runner", r.Run)

	gauge := func(want float64) func() error {
		return func() error {
			if n := series(t, reg, "orderd_projection_dead_letters_parked"); n != 1 {
				return fmt.Errorf("%d series of orderd_projection_dead_letters, want 1", n)
			}
			if v := metric(t, reg, "orderd_projection_dead_letters_parked", r.Name()); v != want {
				return fmt.Errorf("orderd_projection_dead_letters %v, want %v", v, want)
			}
			return nil
		}
	}
	waitFor(t, 10*time.Second, "dead letters gauge sampled at 0", gauge(0))
	// The counters exist from the start, at 0, so their first increase
	// shows in rate() and increase().
	for _, c := range []string{"orderd_projection_events_applied_total", "orderd_projection_duplicates_skipped_total",
		"orderd_projection_gaps_filled_total", "orderd_projection_repairs_total", "orderd_projection_dead_letters_total",
		"orderd_projection_errors_total"} {
		if n := series(t, reg, c); n != 1 {
			t.Errorf("%s before any event: %d series, want 1", c, n)
		}
	}

	// v2 of a stream whose log holds only v1: parked after two deliveries.
	gapV2 := newEvent("gapped", 2, domain.OrderApproved{}, at.Add(time.Hour))
	b.publishEvents(t, ctx, []domain.Event{gapV2}, func(e domain.Event) string { return e.ID })
	waitFor(t, 20*time.Second, "dead letters gauge at 1", gauge(1))
	if n := metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
		t.Errorf("orderd_projection_dead_letters_total %v, want 1", n)
	}

	// Fix the cause and retry: the dead letter is gone, and so is the
	// gauge's count; the counter keeps its history.
	if _, err := es.Append(ctx, domain.Commit{StreamID: "gapped", StreamType: domain.StreamTypeOrder, ExpectedVersion: 1,
		Events: []domain.Event{gapV2}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Retry(ctx, r.Name()+":"+gapV2.ID); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	waitFor(t, 10*time.Second, "dead letters gauge back at 0", gauge(0))
	if n := metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
		t.Errorf("orderd_projection_dead_letters_total %v after the retry, want 1", n)
	}
}

// series counts the series of the metric family name in reg.
func series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	for _, mf := range mustGather(t, reg) {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}
