package projector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
	"github.com/orderd/orderd/projector"
	"github.com/orderd/orderd/projector/projectortest"
)

// TestDeadLettersMetric: orderd_projection_dead_letters follows the number
// of dead letters parked now: 1 once an event whose gap the log cannot fill
// is parked, 0 again once a retry has healed it (unlike the counter
// orderd_projection_dead_letters_total, which stays at 1).
func TestDeadLettersMetric(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	b := projectortest.NewBus(t, ctx)
	db := storetest.Database(t)
	es := projectiontest.NewLog(t, ctx, db)
	at := time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)
	projectiontest.AppendStream(t, ctx, es, "gapped", projectiontest.Lifecycle(0, "cust-g")[:1], 1, at)

	reg := prometheus.NewRegistry()
	pm, m := projection.NewMetrics(reg), projector.NewMetrics(reg)
	dead := projector.NewDeadLetters(db)
	cfg := b.RunnerConfig()
	cfg.MaxDeliveries = 2
	cfg.Workers = 1
	cfg.LagInterval = 100 * time.Millisecond
	r := projector.NewRunner(projection.NewProjection(db, projection.OrderSummaries, es, pm, projection.NewPointers(db)), b.JS, dead, cfg, projectiontest.Logger(t), m)
	projectiontest.Go(t, "summaries runner", r.Run)

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
		"orderd_projection_gaps_filled_total", "orderd_projection_repairs_total", "orderd_projection_dead_letters_total",
		"orderd_projection_errors_total"} {
		if n := projectiontest.Series(t, reg, c); n != 1 {
			t.Errorf("%s before any event: %d series, want 1", c, n)
		}
	}

	// v2 of a stream whose log holds only v1: parked after two deliveries.
	gapV2 := projectiontest.NewEvent("gapped", 2, domain.OrderApproved{}, at.Add(time.Hour))
	b.PublishEvents(t, ctx, []domain.Event{gapV2}, func(e domain.Event) string { return e.ID })
	projectiontest.WaitFor(t, 20*time.Second, "dead letters gauge at 1", gauge(1))
	if n := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
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
	projectiontest.WaitFor(t, 10*time.Second, "dead letters gauge back at 0", gauge(0))
	if n := projectiontest.Metric(t, reg, "orderd_projection_dead_letters_total", r.Name()); n != 1 {
		t.Errorf("orderd_projection_dead_letters_total %v after the retry, want 1", n)
	}
}
