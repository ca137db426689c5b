package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
)

// TestTaskClaimedByExactlyOneWorker runs eight workers on one verify job:
// its task is claimed once, by one of them (invariant 6).
func TestTaskClaimedByExactlyOneWorker(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	k, _ := projectedKit(t, ctx, "clm", 10, 2)
	job, err := k.jobs.StartVerify(ctx, projection.OrderSummaries.Name, false)
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
