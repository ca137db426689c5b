package http_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// TestWaitersShareOneRead: many requests waiting on one summary read the
// store once each to start, and then share one poller, instead of each
// polling; when the read model reaches the version every one of them
// answers it.
func TestWaitersShareOneRead(t *testing.T) {
	e := newEnv(t)
	e.reads.put(domain.Order{ID: "o-1", Version: 1})
	const waiters = 200
	answers := make(chan int, waiters)
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := e.get(t, "/v1/order-summaries/o-1?min_version=3&wait=20s")
			answers <- rec.Code
			if got := rec.Header().Get("X-Read-Model-Version"); got != "3" {
				t.Errorf("answered version %q, want 3", got)
			}
		}()
	}
	// Every waiter has made its own first read before the read model
	// moves, so what follows is the shared poller's.
	deadline := time.Now().Add(20 * time.Second)
	for e.reads.callCount() < waiters && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	before := e.reads.callCount()
	time.Sleep(600 * time.Millisecond) // one poller, every 20 ms: about 30 reads
	during := e.reads.callCount() - before
	e.reads.put(domain.Order{ID: "o-1", Version: 3})
	wg.Wait()
	close(answers)
	for code := range answers {
		if code != http.StatusOK {
			t.Errorf("a waiter answered %d", code)
		}
	}
	if during > waiters/2 {
		t.Errorf("%d waiters made %d reads in 600ms of waiting, want one poller's few (each polling would make over %d)", waiters, during, waiters)
	}
}

// TestWaitsHaveTheirOwnLimit: past MaxWaits concurrent waits a wait is
// answered 503 with Retry-After, while commands still go through.
func TestWaitsHaveTheirOwnLimit(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) { c.MaxWaits = 4 })
	var wg sync.WaitGroup
	codes := make(chan int, 4)
	for i := range 4 {
		e.reads.put(domain.Order{ID: fmt.Sprintf("w-%d", i), Version: 1})
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- e.get(t, fmt.Sprintf("/v1/order-summaries/w-%d?min_version=9&wait=30s", i)).Code
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.reads.callCount() < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// Until the four have taken their slots a probe may get one, and
	// answers stale after its 1ms wait.
	rec := e.get(t, "/v1/order-summaries/w-0?min_version=9&wait=1ms")
	for i := 0; rec.Code == http.StatusOK && i < 1000; i++ {
		time.Sleep(time.Millisecond)
		rec = e.get(t, "/v1/order-summaries/w-0?min_version=9&wait=1ms")
	}
	wantProblem(t, rec, http.StatusServiceUnavailable, "/problems/overloaded")
	if rec.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	e.place(t, "o-during-waits")
	for i := range 4 {
		e.reads.put(domain.Order{ID: fmt.Sprintf("w-%d", i), Version: 9})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a wait answered %d", c)
		}
	}
}
