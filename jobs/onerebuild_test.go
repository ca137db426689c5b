package jobs_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// TestOneRebuildPerProjection: of rebuilds started at once, with no
// worker to run them, one is created and every other is refused with
// ErrJobRunning, and the pointer names the one created. A pointer naming
// a job that was never stored holds the projection for the minute after
// the job's id was made (its creator may still be storing it), and not
// after (its creator died): a start then retires the shadow it left.
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

	// A creator that announced its shadow and died before storing its job.
	abandon := func(id string) {
		t.Helper()
		if _, err := k.ps.Update(ctx, name, coll, func(p *projection.Pointer) (bool, error) {
			p.Shadow, p.ShadowJob, p.ShadowVersion = coll+"_"+id[:8], id, projection.OrderSummaries.Version
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	abandon(madeAt(time.Now()))
	if _, err := k.jobs.StartRebuild(ctx, name, 1); !errors.Is(err, domain.ErrJobRunning) {
		t.Errorf("a start while the pointer names a job made just now, not stored yet: %v, want ErrJobRunning", err)
	}
	dead := madeAt(time.Now().Add(-2 * time.Minute))
	abandon(dead)
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatalf("a start while the pointer names a job made two minutes ago and never stored: %v", err)
	}
	if ptr, err = k.ps.Get(ctx, name, coll, 0); err != nil {
		t.Fatal(err)
	}
	if ptr.ShadowJob != job.ID || ptr.Shadow != job.Shadow {
		t.Errorf("pointer after taking over from %s: job %q shadow %q; want %s %s", dead, ptr.ShadowJob, ptr.Shadow, job.ID, job.Shadow)
	}
}

// madeAt is a job id (a UUIDv7) made at t.
func madeAt(t time.Time) string {
	id := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(id[:6], ms[2:])
	return id.String()
}
