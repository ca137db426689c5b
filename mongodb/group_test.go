package mongodb_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
)

// inserts counts the insert commands a client sends.
type inserts struct {
	mu sync.Mutex
	n  int
}

func (c *inserts) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "insert" {
			c.mu.Lock()
			c.n++
			c.mu.Unlock()
		}
	}}
}

// during returns the inserts fn sent.
func (c *inserts) during(fn func()) int {
	c.mu.Lock()
	c.n = 0
	c.mu.Unlock()
	fn()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// monitoredStore is a Store whose client counts its inserts, with its
// metrics in reg.
func monitoredStore(t *testing.T) (*mongodb.EventStore, *inserts, *prometheus.Registry) {
	t.Helper()
	counter := &inserts{}
	db := storetest.Connect(t, mongodb.ClientOptions(storetest.MongoURI(t)).SetMonitor(counter.monitor()))
	reg := prometheus.NewRegistry()
	s := mongodb.NewEventStore(db, mongodb.WithMetrics(mongodb.NewEventStoreMetrics(reg)))
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, counter, reg
}

// waitQueued waits until n appends are queued behind the held insert.
func waitQueued(t *testing.T, s *mongodb.EventStore, n int) {
	t.Helper()
	projectiontest.WaitFor(t, 30*time.Second, "appends to queue", func() error {
		if q := mongodb.QueuedAppends(s); q != n {
			return fmt.Errorf("%d queued", q)
		}
		return nil
	})
}

// batchSizes returns the count and sum of orderd_append_batch_size.
func batchSizes(t *testing.T, reg *prometheus.Registry) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "orderd_append_batch_size" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatal("no orderd_append_batch_size")
	return 0, 0
}

// appendAll appends each commit from a goroutine of its own, all let go
// together, and returns their errors by index.
func appendAll(ctx context.Context, s *mongodb.EventStore, commits []domain.Commit) []error {
	errs := make([]error, len(commits))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range commits {
		wg.Go(func() {
			<-start
			_, errs[i] = s.Append(ctx, c)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func newStreams(n int) []domain.Commit {
	commits := make([]domain.Commit, n)
	for i := range commits {
		commits[i] = storetest.NewCommit(storetest.Unique("order-"), 0, domain.OrderApproved{})
	}
	return commits
}

// TestGroupCommitInserts counts the inserts appends send: a lone append
// sends one insert at once (there is no timer: had it waited for company
// it would never return); appends queued behind an insert in flight go in
// one insert when it returns; appends let go together send fewer inserts
// than there are appends. The batch size histogram adds up to the appends.
func TestGroupCommitInserts(t *testing.T) {
	s, counter, reg := monitoredStore(t)
	ctx := t.Context()
	appends := 0

	if n := counter.during(func() {
		if _, err := s.Append(ctx, newStreams(1)[0]); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("a lone append sent %d inserts, want 1", n)
	}
	appends++

	const queued = 40
	if n := counter.during(func() {
		release := mongodb.HoldAppends(s)
		var errs []error
		done := make(chan struct{})
		go func() {
			defer close(done)
			errs = appendAll(ctx, s, newStreams(queued))
		}()
		waitQueued(t, s, queued)
		release()
		<-done
		for i, err := range errs {
			if err != nil {
				t.Errorf("queued append %d: %v", i, err)
			}
		}
	}); n != 1 {
		t.Errorf("%d appends queued behind an insert sent %d inserts, want 1", queued, n)
	}
	appends += queued

	const together = 64
	if n := counter.during(func() {
		for i, err := range appendAll(ctx, s, newStreams(together)) {
			if err != nil {
				t.Errorf("append %d: %v", i, err)
			}
		}
	}); n >= together {
		t.Errorf("%d appends let go together sent %d inserts, want fewer", together, n)
	} else {
		t.Logf("%d appends let go together sent %d inserts", together, n)
	}
	appends += together

	if count, sum := batchSizes(t, reg); sum != float64(appends) || count < 3 {
		t.Errorf("batch sizes: %d batches of %v commits in all, want %d commits in at least 3", count, sum, appends)
	}
}

// TestAppendCancelledWhileQueued: an append whose context ends while it
// waits for the insert in flight is taken out of the queue, returns the
// context's error, and stores nothing; the others queued with it are
// written.
func TestAppendCancelledWhileQueued(t *testing.T) {
	s, counter, _ := monitoredStore(t)
	release := mongodb.HoldAppends(s)
	ctx, cancel := context.WithCancel(t.Context())
	gone, kept := newStreams(1)[0], newStreams(1)[0]
	goneErr, keptErr := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.Append(ctx, gone); goneErr <- err }()
	waitQueued(t, s, 1)
	go func() { _, err := s.Append(t.Context(), kept); keptErr <- err }()
	waitQueued(t, s, 2)
	cancel()
	if err := <-goneErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled queued append: %v, want context.Canceled", err)
	}
	if n := mongodb.QueuedAppends(s); n != 1 {
		t.Fatalf("%d appends queued after the cancel, want 1", n)
	}
	if n := counter.during(func() {
		release()
		if err := <-keptErr; err != nil {
			t.Errorf("the other queued append: %v", err)
		}
	}); n != 1 {
		t.Errorf("%d inserts, want 1", n)
	}
	for c, want := range map[*domain.Commit]int{&gone: 0, &kept: 1} {
		evs, err := s.Load(t.Context(), c.StreamID, 0)
		if err != nil || len(evs) != want {
			t.Errorf("stream %s holds %d events (%v), want %d", c.StreamID, len(evs), err, want)
		}
	}
}

// TestAppendCancelledInBatch: once its batch is handed to a writer, an
// append waits for the insert's outcome whatever its context does, and
// the insert does not fail because the context of the append that writes
// it ended.
func TestAppendCancelledInBatch(t *testing.T) {
	s, _ := storetest.OpenStore(t)
	release := mongodb.HoldAppends(s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	commits := newStreams(3)
	errs := make(chan error, len(commits))
	for i, c := range commits {
		go func() { _, err := s.Append(ctx, c); errs <- err }()
		waitQueued(t, s, i+1)
	}
	release() // the three are a batch now; the first writes it
	cancel()
	for range commits {
		if err := <-errs; err != nil {
			t.Errorf("append in a batch whose context ended: %v, want stored", err)
		}
	}
	for _, c := range commits {
		if evs, err := s.Load(t.Context(), c.StreamID, 0); err != nil || len(evs) != 1 {
			t.Errorf("stream %s holds %d events (%v), want 1", c.StreamID, len(evs), err)
		}
	}
}

// BenchmarkAppendParallel: 32 goroutines append commits of one event, each
// to a stream of its own, on MONGODB_URI or the embedded store.
func BenchmarkAppendParallel(b *testing.B) {
	reg := prometheus.NewRegistry()
	s, _ := storetest.OpenStore(b, mongodb.WithMetrics(mongodb.NewEventStoreMetrics(reg)))
	b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		stream, v := storetest.Unique("order-"), int64(0)
		for pb.Next() {
			if _, err := s.Append(b.Context(), storetest.NewCommit(stream, v, domain.OrderApproved{})); err != nil {
				b.Error(err)
				return
			}
			v++
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			if h := mf.GetMetric()[0].GetHistogram(); mf.GetName() == "orderd_append_batch_size" && h.GetSampleCount() > 0 {
				b.ReportMetric(h.GetSampleSum()/float64(h.GetSampleCount()), "commits/insert")
			}
		}
	}
}
