package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
)

// TestRebuildMetrics runs rebuilds of two partitions on a Worker with
// metrics: orderd_rebuild_running is 1 while it works and 0 after,
// orderd_rebuild_events_done and orderd_rebuild_streams_done grow during
// the scan and end at the log's totals, and a second rebuild counts
// afresh rather than adding to the first.
func TestRebuildMetrics(t *testing.T) {
	ctx := projectiontest.Context(t, 90*time.Second)
	k, f := projectedKit(t, ctx, "rbm", 30, 3)
	db := k.db

	reg := prometheus.NewRegistry()
	m := jobs.NewMetrics(reg)
	name := projection.OrderSummaries.Name
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 0 {
			t.Errorf("%s before any rebuild: %d series, want none", g, n)
		}
	}
	// Paced, so the scan lasts long enough to be watched: about a second
	// for the fixture's events.
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 4, MaxEventsPerSecond: float64(len(f.Flat)), Metrics: m})
	// A worker with metrics exposes the gauges of the projections it
	// manages at once, at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 2 {
			t.Errorf("%s once the worker is up: %d series, want 2 (one per projection)", g, n)
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
		if job.State != domain.StateSucceeded {
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
	// The projection not rebuilt kept its gauges at 0.
	for _, g := range []string{"orderd_rebuild_running", "orderd_rebuild_events_done", "orderd_rebuild_streams_done"} {
		if n := projectiontest.Series(t, reg, g); n != 2 {
			t.Errorf("%s: %d series, want 2", g, n)
		}
		if v := projectiontest.Metric(t, reg, g, projection.CustomerOrderStats.Name); v != 0 {
			t.Errorf("%s of %s, never rebuilt: %v", g, projection.CustomerOrderStats.Name, v)
		}
	}
	if err := projectiontest.DiffReadModels(ctx, db, f); err != nil {
		t.Error(err)
	}
}
