package projector_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// partitionSeconds returns the lag in seconds of every partition, failing
// on one JetStream could not tell, and the largest.
func partitionSeconds(ctx context.Context, r *projector.Runner) (map[int]float64, float64, error) {
	out, top := map[int]float64{}, 0.0
	for _, p := range r.PartitionStatus(ctx) {
		if p.LagSeconds == nil {
			return nil, 0, fmt.Errorf("partition %d: lag seconds unknown", p.Partition)
		}
		out[p.Partition] = *p.LagSeconds
		top = max(top, *p.LagSeconds)
	}
	return out, top, nil
}

// TestLagSeconds: a caught-up projection is 0 seconds behind, in its
// partition status, its owner's gauge and a LagWatch; once its projector
// stops and the order moves on, it is behind by at least the time since
// the newest event it applied was recorded.
func TestLagSeconds(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 90*time.Second)
	log := projectiontest.Logger(t)
	relayLog(t, es, db, b, log)
	reg := prometheus.NewRegistry()
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, projection.NewMetrics(reg), mongodb.NewPointers(db))
	cfg := b.RunnerConfig()
	r := projector.NewRunner(p, b.JS, mongodb.NewDeadLetters(db), cfg, log, projector.NewMetrics(reg))
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-stopped })

	watch := projector.NewLagWatch([]*projector.Runner{r}, 250*time.Millisecond, log)
	projectiontest.Go(t, "lag watch", watch.Run)

	svc := domain.NewService(es, nil)
	placed, err := svc.Execute(ctx, "lag-1", domain.PlaceOrder{CustomerID: "c-1", Currency: "BRL",
		Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 100}}}, domain.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	projectortest.WaitLag(t, ctx, 30*time.Second, r)
	_, events, err := svc.EventsUntil(ctx, placed.OrderID, domain.Bound{})
	if err != nil {
		t.Fatal(err)
	}
	applied := events[0].RecordedAt

	// Caught up: every partition 0, in the status, the gauge and the watch.
	secs, _, err := partitionSeconds(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	for part, s := range secs {
		if s != 0 {
			t.Errorf("caught up: partition %d is %v s behind", part, s)
		}
	}
	projectiontest.WaitFor(t, 10*time.Second, "the watch and the gauge at 0 s", func() error {
		if s, fresh := watch.LagSeconds(r.Name()); !fresh || s != 0 {
			return fmt.Errorf("watch: %v s (fresh %v)", s, fresh)
		}
		// One series per partition this process holds: the order's.
		if n := gaugeSeries(t, reg, "orderd_projection_lag_seconds", r.Name()); n != 1 {
			return fmt.Errorf("%d gauge series, want one, the held partition's", n)
		}
		if v := projectiontest.Metric(t, reg, "orderd_projection_lag_seconds", r.Name()); v != 0 {
			return fmt.Errorf("gauge %v", v)
		}
		return nil
	})

	// Stalled: the projector stops, the order moves on.
	stop()
	if err := <-stopped; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	stopped <- nil // for the cleanup
	if _, err := svc.Execute(ctx, placed.OrderID, domain.Approve{}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	projectiontest.WaitFor(t, 30*time.Second, "the approval pending", func() error {
		if n, err := r.Lag(ctx); err != nil || n != 1 {
			return fmt.Errorf("lag %d (%v)", n, err)
		}
		return nil
	})
	_, events, err = svc.EventsUntil(ctx, placed.OrderID, domain.Bound{})
	if err != nil {
		t.Fatal(err)
	}
	floor := events[1].RecordedAt.Sub(applied).Seconds() // the least it can be behind
	before := time.Now()
	_, top, err := partitionSeconds(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if most := time.Since(applied).Seconds(); top < floor || top <= 0 || top > most {
		t.Errorf("stalled: %v s behind, want in [%v, %v] and > 0", top, floor, most)
	}
	projectiontest.WaitFor(t, 10*time.Second, "the watch sees the stall", func() error {
		s, fresh := watch.LagSeconds(r.Name())
		if !fresh || s <= 0 {
			return fmt.Errorf("watch: %v s (fresh %v)", s, fresh)
		}
		if low := before.Sub(applied).Seconds(); s < low {
			return fmt.Errorf("watch: %v s, want at least %v (sampled after the stall)", s, low)
		}
		return nil
	})
}

// gaugeSeries counts the series of gauge name of projection.
func gaugeSeries(t *testing.T, reg *prometheus.Registry, name, projection string) int {
	t.Helper()
	n := 0
	for _, mf := range projectiontest.MustGather(t, reg) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projection" && l.GetValue() == projection {
					n++
				}
			}
		}
	}
	return n
}
