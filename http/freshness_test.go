package http_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// fakeLag is a ProjectionLag whose samples the test sets; a projection
// without one has no fresh sample.
type fakeLag struct {
	mu      sync.Mutex
	seconds map[string]float64
}

// Latest has no fresh sample: the fake's lag admits every command.
func (f *fakeLag) Latest() (uint64, string, float64, bool) { return 0, "", 0, false }

func (f *fakeLag) LagSeconds(name string) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.seconds[name]
	return s, ok
}

// wantAge checks that header Read-Model-Age is a number of seconds within
// [min, min+slack].
func wantAge(t *testing.T, rec *httptest.ResponseRecorder, min time.Duration) {
	t.Helper()
	v := rec.Header().Get("Read-Model-Age")
	age, err := strconv.ParseFloat(v, 64)
	if err != nil || age < min.Seconds() || age > min.Seconds()+30 {
		t.Errorf("Read-Model-Age = %q, want about %v", v, min)
	}
}

func TestFreshnessHeaders(t *testing.T) {
	lag := &fakeLag{seconds: map[string]float64{"order_summaries": 2.5}}
	e := newEnv(t, func(c *orderhttp.Config) { c.Lag = lag })
	now := time.Now()
	old := summary("o-old", 4) // written before documents carried recorded_at
	recent := summary("o-new", 2)
	recent.RecordedAt = now.Add(-90 * time.Second)
	older := summary("o-older", 7)
	older.RecordedAt = now.Add(-time.Hour)
	for _, o := range []domain.Order{old, recent, older} {
		e.reads.put(o)
	}
	e.reads.stats["c-1"] = domain.CustomerOrderStats{CustomerID: "c-1", OrderCount: 3, RecordedAt: now.Add(-10 * time.Second)}
	e.reads.stats["c-2"] = domain.CustomerOrderStats{CustomerID: "c-2", OrderCount: 1}

	t.Run("summary", func(t *testing.T) {
		rec := e.get(t, "/v1/order-summaries/o-new")
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		h := rec.Header()
		if h.Get("Read-Model-Version") != "2" || h.Get("X-Read-Model-Version") != "2" {
			t.Errorf("Read-Model-Version %q, X-Read-Model-Version %q, want 2", h.Get("Read-Model-Version"), h.Get("X-Read-Model-Version"))
		}
		wantAge(t, rec, 90*time.Second)
		if v := h.Get("Read-Model-Lag"); v != "2.500" {
			t.Errorf("Read-Model-Lag = %q, want 2.500", v)
		}
	})
	t.Run("summary without recorded_at", func(t *testing.T) {
		rec := e.get(t, "/v1/order-summaries/o-old")
		if rec.Code != http.StatusOK || rec.Header().Get("Read-Model-Version") != "4" {
			t.Fatalf("%d, Read-Model-Version %q", rec.Code, rec.Header().Get("Read-Model-Version"))
		}
		if v, ok := rec.Header()["Read-Model-Age"]; ok {
			t.Errorf("Read-Model-Age = %q for a document without recorded_at", v)
		}
	})
	t.Run("list: the newest document", func(t *testing.T) {
		rec := e.get(t, "/v1/order-summaries?customer_id=c-1")
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		wantAge(t, rec, 90*time.Second)
		if v := rec.Header().Get("Read-Model-Lag"); v != "2.500" {
			t.Errorf("Read-Model-Lag = %q, want 2.500", v)
		}
		if v, ok := rec.Header()["Read-Model-Version"]; ok {
			t.Errorf("Read-Model-Version = %q on a list", v)
		}
	})
	t.Run("stats", func(t *testing.T) {
		rec := e.get(t, "/v1/customers/c-1/order-stats")
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		wantAge(t, rec, 10*time.Second)
		// The stats are summed from the summaries: their lag.
		if v := rec.Header().Get("Read-Model-Lag"); v != "2.500" {
			t.Errorf("Read-Model-Lag = %q, want the summaries' 2.500", v)
		}
		rec = e.get(t, "/v1/customers/c-2/order-stats")
		if v, ok := rec.Header()["Read-Model-Age"]; ok {
			t.Errorf("Read-Model-Age = %q for stats without recorded_at", v)
		}
	})
	t.Run("no lag watch", func(t *testing.T) {
		e := newEnv(t)
		e.reads.put(recent)
		rec := e.get(t, "/v1/order-summaries/o-new")
		wantAge(t, rec, 90*time.Second)
		if v, ok := rec.Header()["Read-Model-Lag"]; ok {
			t.Errorf("Read-Model-Lag = %q without a lag watch", v)
		}
	})
}
