package http_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// historyEnv is an env whose store records commit n at base + n minutes:
// o-1 placed (v1) at +1m, approved (v2) at +2m, invoiced (v3) at +3m.
func historyEnv(t *testing.T, mod ...func(*orderhttp.Config)) (*env, time.Time) {
	t.Helper()
	base := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	e := newEnv(t, mod...)
	var mu sync.Mutex
	n := 0
	e.store.Now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		n++
		return base.Add(time.Duration(n) * time.Minute)
	}
	e.place(t, "o-1")
	e.run(t, "o-1", "approve", "invoice")
	return e, base
}

func TestGetOrderAsOf(t *testing.T) {
	e, base := historyEnv(t)
	at := func(d time.Duration) string { return url.QueryEscape(base.Add(d).Format(time.RFC3339Nano)) }
	for _, tt := range []struct {
		query   string
		version int64
		status  domain.Status
	}{
		{"as_of_version=1", 1, domain.StatusCreated},
		{"as_of_version=2", 2, domain.StatusApproved},
		{"as_of_version=3", 3, domain.StatusInvoiced},
		{"as_of=" + at(time.Minute), 1, domain.StatusCreated}, // recorded_at is inclusive
		{"as_of=" + at(2*time.Minute+30*time.Second), 2, domain.StatusApproved},
		{"as_of=" + url.QueryEscape(base.Add(2*time.Minute).In(time.FixedZone("", -3*3600)).Format(time.RFC3339)), 2, domain.StatusApproved},
		{"as_of=" + at(time.Hour), 3, domain.StatusInvoiced},
	} {
		t.Run(tt.query, func(t *testing.T) {
			rec := e.get(t, "/v1/orders/o-1?"+tt.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			var o domain.Order
			if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
				t.Fatal(err)
			}
			if o.Version != tt.version || o.Status != tt.status {
				t.Errorf("order at v%d %s, want v%d %s", o.Version, o.Status, tt.version, tt.status)
			}
			if want := base.Add(time.Duration(tt.version) * time.Minute); !o.RecordedAt.Equal(want) {
				t.Errorf("recorded_at %v, want %v", o.RecordedAt, want)
			}
			if et, want := rec.Header().Get("ETag"), fmt.Sprintf(`"%d"`, tt.version); et != want {
				t.Errorf("ETag = %q, want %q", et, want)
			}

			rec = e.get(t, "/v1/orders/o-1/events?"+tt.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("events: %d %s", rec.Code, rec.Body)
			}
			var body struct {
				Version int64             `json:"version"`
				Events  []json.RawMessage `json:"events"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Version != tt.version || int64(len(body.Events)) != tt.version {
				t.Errorf("events: version %d with %d events, want %d of each", body.Version, len(body.Events), tt.version)
			}
			for i, raw := range body.Events {
				if ev, err := domain.UnmarshalEvent(raw); err != nil || ev.Version != int64(i+1) {
					t.Errorf("event %d: v%d, %v", i, ev.Version, err)
				}
			}
		})
	}
}

func TestGetOrderAsOfInvalid(t *testing.T) {
	e, _ := historyEnv(t)
	for _, tt := range []struct{ query, field string }{
		{"as_of_version=abc", "as_of_version"},
		{"as_of_version=0", "as_of_version"},
		{"as_of_version=-1", "as_of_version"},
		{"as_of_version=1.5", "as_of_version"},
		{"as_of_version=", "as_of_version"},
		{"as_of_version=99999999999999999999", "as_of_version"},
		{"as_of=yesterday", "as_of"},
		{"as_of=2026-11-25", "as_of"},
		{"as_of=2026-13-01T00:00:00Z", "as_of"},
		{"as_of=2026-11-25T08:00:00", "as_of"}, // no offset
		{"as_of=", "as_of"},
		{"as_of=0000-01-01T00:00:00Z", "as_of"},
		{"as_of_version=1&as_of=2026-11-25T08:00:00Z", "as_of"},
	} {
		for _, path := range []string{"/v1/orders/o-1?", "/v1/orders/o-1/events?", "/v1/orders/nope?"} {
			t.Run(path+tt.query, func(t *testing.T) {
				wantProblem(t, e.get(t, path+tt.query), http.StatusUnprocessableEntity, "/problems/validation", tt.field)
			})
		}
	}
}

func TestGetOrderAsOfNotFound(t *testing.T) {
	e, base := historyEnv(t)
	for _, tt := range []struct{ path, detail string }{
		{"/v1/orders/o-1?as_of_version=4", "head is v3"},
		{"/v1/orders/o-1/events?as_of_version=4", "head is v3"},
		{"/v1/orders/o-1?as_of=" + base.Add(time.Minute-time.Millisecond).Format(time.RFC3339Nano), "head v3"},
		{"/v1/orders/o-1/events?as_of=" + base.Format(time.RFC3339), "head v3"},
		{"/v1/orders/nope?as_of_version=1", ""},
		{"/v1/orders/nope/events?as_of=" + base.Format(time.RFC3339), ""},
	} {
		t.Run(tt.path, func(t *testing.T) {
			p := wantProblem(t, e.get(t, tt.path), http.StatusNotFound, "/problems/not-found")
			if !strings.Contains(p.Detail, tt.detail) {
				t.Errorf("detail %q does not say %q", p.Detail, tt.detail)
			}
		})
	}
}

// countingCache is a domain.StateCache that counts its calls.
type countingCache struct {
	mu       sync.Mutex
	states   map[string]domain.Order
	gets     int
	adds     int
	removals int
}

func (c *countingCache) Get(id string) (domain.Order, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gets++
	o, ok := c.states[id]
	return o, ok
}

func (c *countingCache) Add(id string, o domain.Order) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.adds++
	c.states[id] = o
	return false
}

func (c *countingCache) Remove(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removals++
	_, ok := c.states[id]
	delete(c.states, id)
	return ok
}

func (c *countingCache) calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets + c.adds + c.removals
}

// TestGetOrderAsOfBypassesCache: a bounded read neither reads the state
// cache nor fills it, so the cache keeps the head state commands use.
func TestGetOrderAsOfBypassesCache(t *testing.T) {
	cache := &countingCache{states: map[string]domain.Order{}}
	e, _ := historyEnv(t, func(c *orderhttp.Config) {
		c.Commands = domain.NewService(c.Commands.(*domain.Service).Store, cache)
	})
	before := cache.calls()
	if before == 0 {
		t.Fatal("the commands did not use the cache")
	}
	for _, path := range []string{"/v1/orders/o-1?as_of_version=1", "/v1/orders/o-1?as_of=2026-11-25T08:01:00Z",
		"/v1/orders/o-1/events?as_of_version=2"} {
		if rec := e.get(t, path); rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if n := cache.calls(); n != before {
		t.Errorf("bounded reads called the cache %d times", n-before)
	}
	if o, _ := cache.Get("o-1"); o.Version != 3 {
		t.Errorf("cached state at v%d, want the head v3", o.Version)
	}
	// The unbounded read does use it: the count above can see a call.
	before = cache.calls()
	if rec := e.get(t, "/v1/orders/o-1"); rec.Code != http.StatusOK || cache.calls() == before {
		t.Errorf("GET head: %d, cache calls %d -> %d", rec.Code, before, cache.calls())
	}
}
