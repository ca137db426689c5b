package mongodb_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb/storetest"
)

// BenchmarkBrowse times the log browser's pages on a log of
// ORDERD_BENCH_LOG_COMMITS commits (20,000 unless set), appended by 32
// goroutines: the newest page of 50, the next one by its cursor, the
// commits of one correlation id (a commit in the middle of the log), and
// a page filtered by an event type no commit has, which searches until
// the log's end or the page's deadline; then every page of that filter to
// the log's end. On MONGODB_URI or the embedded store. It does its work
// once whatever b.N (run it with -benchtime 1x) and prints the times.
func BenchmarkBrowse(b *testing.B) {
	n := readerSumsCount(b, "ORDERD_BENCH_LOG_COMMITS", 20_000)
	s, _ := storetest.OpenStore(b)
	ctx := b.Context()
	var next atomic.Int64
	var wg sync.WaitGroup
	var wanted string // the correlation id of the commit in the middle
	var once sync.Once
	start := time.Now()
	for range 32 {
		wg.Go(func() {
			for {
				k := next.Add(1)
				if k > int64(n) {
					return
				}
				c := storetest.NewCommit(fmt.Sprintf("browse-%07d", k), 0, domain.OrderApproved{})
				if k == int64(n/2) {
					once.Do(func() { wanted = c.Events[0].Metadata.CorrelationID })
				}
				if _, err := s.Append(ctx, c); err != nil {
					b.Error(err)
					return
				}
				if k%5000 == 0 {
					readerSumsProgress("appended %d commits", k)
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	readerSumsProgress("appended %d commits in %v", n, time.Since(start).Round(time.Millisecond))
	b.ResetTimer()
	page := func(what string, q domain.LogQuery) domain.LogPage {
		b.Helper()
		start := time.Now()
		p, err := s.Browse(ctx, q)
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		b.Logf("%-48s %8v  %d commits, more: %v", what, time.Since(start).Round(100*time.Microsecond), len(p.Commits), p.Next != "")
		return p
	}
	newest := page("newest page of 50", domain.LogQuery{Limit: 50})
	page("the next, by cursor", domain.LogQuery{Limit: 50, Cursor: newest.Next})
	if got := page("one correlation id (one commit)", domain.LogQuery{Limit: 50, CorrelationID: wanted}); len(got.Commits) != 1 {
		b.Errorf("correlation id %s: %d commits, want 1", wanted, len(got.Commits))
	}
	q := domain.LogQuery{Limit: 50, Type: domain.TypeOrderDelivered}
	start = time.Now()
	first := page("a type no commit has: the first page", q)
	pages := 1
	for p := first; p.Next != ""; pages++ {
		q.Cursor = p.Next
		var err error
		if p, err = s.Browse(ctx, q); err != nil {
			b.Fatal(err)
		}
		if len(p.Commits) > 0 {
			b.Fatalf("a type no commit has: %d commits", len(p.Commits))
		}
	}
	b.Logf("%-48s %8v  %d pages", "a type no commit has: every page to the end", time.Since(start).Round(time.Millisecond), pages)
}
