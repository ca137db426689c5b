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
	"github.com/orderd/orderd/jobs"
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

// TestSwitchBacksAtOnce: switch backs sent together (a double click) run
// one at a time under the rebuild lock: each is done or refused with
// ErrJobRunning, the pointer ends where the number done says, and the
// collection left as previous is on the drop list while the active one
// is not.
func TestSwitchBacksAtOnce(t *testing.T) {
	ctx, k, _ := projectedKit(t, 60*time.Second, "back", 6, 2)
	name, coll := projection.OrderSummaries.Name, projection.OrderSummaries.Collection
	k.worker(t, "w1", jobs.WorkerConfig{BatchStreams: 5, Grace: time.Hour})
	before, err := k.ps.Get(ctx, name, coll, 0)
	if err != nil {
		t.Fatal(err)
	}
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if job = k.waitJob(t, ctx, job.ID, 30*time.Second); job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %s %s", job.State, job.Error)
	}

	total := 0
	for round := range 3 {
		const clicks = 4
		var wg sync.WaitGroup
		var mu sync.Mutex
		done := 0
		for range clicks {
			wg.Go(func() {
				_, err := k.jobs.SwitchBack(ctx, name)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					done++
				case !errors.Is(err, domain.ErrJobRunning):
					t.Errorf("round %d: switch back: %v", round, err)
				}
			})
		}
		wg.Wait()
		ptr, err := k.ps.Get(ctx, name, coll, 0)
		if err != nil {
			t.Fatal(err)
		}
		total += done
		active, previous := job.Shadow, before.Active
		if total%2 == 1 {
			active, previous = previous, active
		}
		if done == 0 || ptr.Active != active || ptr.Previous != previous {
			t.Fatalf("round %d: %d of %d switch backs done, %d in all; pointer active %q previous %q, want %q %q",
				round, done, clicks, total, ptr.Active, ptr.Previous, active, previous)
		}
		if _, listed, err := k.ps.DropAfter(ctx, ptr.Previous); err != nil || !listed {
			t.Errorf("round %d: previous %s not on the drop list (%v)", round, ptr.Previous, err)
		}
		if _, listed, err := k.ps.DropAfter(ctx, ptr.Active); err != nil || listed {
			t.Errorf("round %d: active %s on the drop list (%v)", round, ptr.Active, err)
		}
	}
}
