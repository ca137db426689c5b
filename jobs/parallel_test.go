package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
)

// TestRebuildPartitionsRunAtOnce: a rebuild in 2 partitions on one worker
// with the default concurrency scans both at the same time (both tasks
// held by it, their leases live), and while it does the projections'
// status says what the job says: running, scanning, with progress.
func TestRebuildPartitionsRunAtOnce(t *testing.T) {
	ctx, k, _ := projectedKit(t, 90*time.Second, "par", 80, 4)
	// Paced so that the scan is still under way when it is looked at.
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 4, MaxEventsPerSecond: 40})
	job, err := k.jobs.StartRebuild(ctx, projection.OrderSummaries.Name, 2)
	if err != nil {
		t.Fatal(err)
	}
	var seen jobs.Job
	projectiontest.WaitFor(t, 30*time.Second, "both partitions running at once", func() error {
		j, err := k.jobs.Get(ctx, job.ID)
		if err != nil {
			return err
		}
		now := time.Now()
		running := 0
		for _, name := range []string{"part-0", "part-1"} {
			if p, ok := j.Task(name); ok && p.State == "running" && p.Owner == "w1" && p.LeaseUntil.After(now) {
				running++
			}
		}
		if running != 2 || j.Events == 0 || j.State.Final() {
			return fmt.Errorf("%d partitions running, job %s, %d events, tasks %+v", running, j.State, j.Events, j.Tasks)
		}
		seen = j
		return nil
	})
	if seen.State != jobs.StateRunning || seen.Phase != "scanning" || seen.Step != 1 || seen.Steps != 3 {
		t.Errorf("job route: %s, phase %+v; want running, 1/3 scanning", seen.State, seen.JobPhase)
	}
	list, err := k.jobs.Status(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.Name != projection.OrderSummaries.Name {
			continue
		}
		r := p.LastRebuild
		if r == nil || r.Job != job.ID || r.State != jobs.StateRunning || r.Phase != "scanning" || r.Events == 0 || r.Percent == nil {
			t.Errorf("status of %s: last rebuild %+v; want %s running, scanning, with events and progress", p.Name, r, job.ID)
		}
	}
	if done := k.waitJob(t, ctx, job.ID, 60*time.Second); done.State != jobs.StateSucceeded || done.Phase != "succeeded" {
		t.Fatalf("rebuild: %s %s, phase %+v", done.State, done.Error, done.JobPhase)
	}
}
