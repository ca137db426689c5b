package jobs_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// TestOneRebuildPerProjection: of rebuilds started at once, with no
// worker to run them, one is created and every other is refused with
// ErrJobRunning, and the pointer names the one created. A rebuild lock
// whose job was never stored holds the projection for a minute after it
// was taken (its creator may still be storing the job), and not after
// (its creator died): a start then takes it over.
func TestOneRebuildPerProjection(t *testing.T) {
	ctx, k, _ := projectedKit(t, 60*time.Second, "one", 6, 2)
	name, coll := projection.OrderSummaries.Name, projection.OrderSummaries.Collection

	const starts = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created []string
	refused := 0
	for range starts {
		wg.Go(func() {
			job, err := k.jobs.StartRebuild(ctx, name, 1)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created = append(created, job.ID)
			case errors.Is(err, domain.ErrJobRunning):
				refused++
			default:
				t.Errorf("start: %v", err)
			}
		})
	}
	wg.Wait()
	if len(created) != 1 || refused != starts-1 {
		t.Fatalf("%d starts at once: %d created %v, %d refused; want 1 and %d", starts, len(created), created, refused, starts-1)
	}
	ptr, err := k.ps.Get(ctx, name, coll, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.ShadowJob != created[0] || ptr.Shadow == "" {
		t.Fatalf("pointer names job %q with shadow %q; want %s's", ptr.ShadowJob, ptr.Shadow, created[0])
	}
	if _, err := k.jobs.Cancel(ctx, created[0]); err != nil {
		t.Fatal(err)
	}

	// A creator that took the lock and died before storing its job.
	locks := k.db.Collection(mongodb.LocksCollection)
	abandon := func(since time.Time) {
		t.Helper()
		projectiontest.Must(t)(locks.ReplaceOne(ctx, bson.D{{Key: "_id", Value: "rebuild:" + name}},
			bson.D{{Key: "job_id", Value: "never-stored"}, {Key: "since", Value: since.UTC()}}, options.Replace().SetUpsert(true)))
	}
	abandon(time.Now())
	if _, err := k.jobs.StartRebuild(ctx, name, 1); !errors.Is(err, domain.ErrJobRunning) {
		t.Errorf("a start while a lock taken just now names a job not stored yet: %v, want ErrJobRunning", err)
	}
	abandon(time.Now().Add(-2 * time.Minute))
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatalf("a start while a lock taken two minutes ago names a job never stored: %v", err)
	}
	if ptr, err = k.ps.Get(ctx, name, coll, 0); err != nil {
		t.Fatal(err)
	}
	if ptr.ShadowJob != job.ID || ptr.Shadow != job.Shadow {
		t.Errorf("pointer after taking the lock over: job %q shadow %q; want %s %s", ptr.ShadowJob, ptr.Shadow, job.ID, job.Shadow)
	}
}
