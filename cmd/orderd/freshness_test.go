package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// TestMain_PastStatesAndFreshness reads an order's past states through the
// whole program (the store's ranged load), and the read models' freshness
// headers once the projections have applied its commands.
func TestMain_PastStatesAndFreshness(t *testing.T) {
	m := runMain(t)
	c := newClient(t, m)
	c.place("fresh-1", "fresh-c", 1, 1000, 0)
	c.step("fresh-1", "approve")
	var head struct {
		Version    int64     `json:"version"`
		Status     string    `json:"status"`
		RecordedAt time.Time `json:"recorded_at"`
	}
	c.must(http.StatusOK, "GET", "/v1/orders/fresh-1", "").decode(t, &head)
	if head.Version != 2 || head.RecordedAt.IsZero() {
		t.Fatalf("head: %+v", head)
	}

	// Past states.
	var v1 struct {
		Version    int64     `json:"version"`
		Status     string    `json:"status"`
		RecordedAt time.Time `json:"recorded_at"`
	}
	r := c.must(http.StatusOK, "GET", "/v1/orders/fresh-1?as_of_version=1", "")
	r.decode(t, &v1)
	if v1.Version != 1 || v1.Status != "created" || r.Header.Get("ETag") != `"1"` {
		t.Errorf("as_of_version=1: %v, ETag %s", r, r.Header.Get("ETag"))
	}
	var at struct {
		Version int64 `json:"version"`
	}
	c.must(http.StatusOK, "GET", "/v1/orders/fresh-1?as_of="+url.QueryEscape(v1.RecordedAt.Format(time.RFC3339Nano)), "").decode(t, &at)
	if at.Version != 1 && !v1.RecordedAt.Equal(head.RecordedAt) {
		t.Errorf("as_of the first event's recorded_at: v%d, want v1", at.Version)
	}
	var events struct {
		Version int64 `json:"version"`
		Events  []any `json:"events"`
	}
	c.must(http.StatusOK, "GET", "/v1/orders/fresh-1/events?as_of_version=1", "").decode(t, &events)
	if events.Version != 1 || len(events.Events) != 1 {
		t.Errorf("events up to v1: version %d, %d events", events.Version, len(events.Events))
	}
	c.must(http.StatusNotFound, "GET", "/v1/orders/fresh-1?as_of_version=3", "")
	c.must(http.StatusNotFound, "GET", "/v1/orders/fresh-1/events?as_of="+url.QueryEscape(v1.RecordedAt.Add(-time.Second).Format(time.RFC3339Nano)), "")
	c.must(http.StatusUnprocessableEntity, "GET", "/v1/orders/fresh-1?as_of_version=0", "")

	// The summary, once it reflects v2: its version, and its age measured
	// from the approval's recorded_at.
	before := time.Now()
	s := c.must(http.StatusOK, "GET", "/v1/order-summaries/fresh-1?min_version=2&wait=20s", "")
	after := time.Now()
	if s.Header.Get("X-Read-Model-Stale") != "" {
		t.Fatalf("summary still stale after 20s: %v", s)
	}
	if v := s.Header.Get("Read-Model-Version"); v != "2" {
		t.Errorf("Read-Model-Version = %q, want 2", v)
	}
	age, err := strconv.ParseFloat(s.Header.Get("Read-Model-Age"), 64)
	const slack = 0.002 // the header's and recorded_at's millisecond rounding
	if low, high := before.Sub(head.RecordedAt).Seconds(), after.Sub(head.RecordedAt).Seconds(); err != nil || age < low-slack || age > high+slack {
		t.Errorf("Read-Model-Age = %q, want in [%.3f, %.3f]", s.Header.Get("Read-Model-Age"), low, high)
	}

	// The projections caught up: once the API's lag sample says so, 0 s.
	var last response
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		last = c.do("GET", "/v1/order-summaries/fresh-1", "")
		return last.Header.Get("Read-Model-Lag") == "0.000"
	}) {
		t.Fatalf("summary: Read-Model-Lag %q after 20s, want 0.000", last.Header.Get("Read-Model-Lag"))
	}
	list := c.must(http.StatusOK, "GET", "/v1/order-summaries?customer_id=fresh-c", "")
	if list.Header.Get("Read-Model-Age") == "" || list.Header.Get("Read-Model-Lag") == "" {
		t.Errorf("list: Read-Model-Age %q, Read-Model-Lag %q", list.Header.Get("Read-Model-Age"), list.Header.Get("Read-Model-Lag"))
	}
	c.waitStats("fresh-c", func(s customerStats) bool { return s.ByStatus["approved"] == 1 })
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		last = c.must(http.StatusOK, "GET", "/v1/customers/fresh-c/order-stats", "")
		return last.Header.Get("Read-Model-Lag") == "0.000"
	}) {
		t.Fatalf("stats: Read-Model-Lag %q after 20s, want 0.000", last.Header.Get("Read-Model-Lag"))
	}
	if a, err := strconv.ParseFloat(last.Header.Get("Read-Model-Age"), 64); err != nil || a < 0 || a > time.Since(head.RecordedAt).Seconds()+0.002 {
		t.Errorf("stats: Read-Model-Age %q", last.Header.Get("Read-Model-Age"))
	}
}

// TestMain_EventAgesByStage checks the histograms that split a command's
// way to its summary into hops: each stage counts the order's events once
// they are applied, and an event is no younger at a stage than at one
// that comes before it, so the sums of the ages are ordered as the stages
// are: read before acknowledged and before delivered, delivered before
// applied. The publisher's ack and the delivery to the projector race (a
// delivery can come first), so they are not compared. (The reader's stage,
// orderd_summary_event_age_seconds, is package http's.)
func TestMain_EventAgesByStage(t *testing.T) {
	m := runMain(t)
	c := newClient(t, m)
	hc := &http.Client{Timeout: 10 * time.Second}
	var mt map[string]float64
	// The relay's first checkpoint on the empty log: it tails it now (a
	// commit before would be published by its first start's catch-up,
	// which the stages do not count).
	if !waitFor(20*time.Second, 20*time.Millisecond, func() bool {
		mt = scrapeMetrics(t.Context(), hc, "http://"+m.HTTPAddr)
		return mt["orderd_relay_checkpoint_recorded_timestamp_seconds"] > 0
	}) {
		t.Fatal("no relay checkpoint within 20s")
	}
	c.place("ages-1", "ages-c", 1, 1000, 0)
	c.step("ages-1", "approve")
	stages := []string{
		`orderd_relay_commit_age_seconds_%s{stage="read"}`,
		`orderd_relay_commit_age_seconds_%s{stage="acknowledged"}`,
		`orderd_projection_event_age_seconds_%s{projection="order_summaries",stage="delivered"}`,
		`orderd_projection_event_age_seconds_%s{projection="order_summaries",stage="applied"}`,
	}
	counted := waitFor(20*time.Second, 20*time.Millisecond, func() bool {
		mt = scrapeMetrics(t.Context(), hc, "http://"+m.HTTPAddr)
		for _, s := range stages {
			if mt[fmt.Sprintf(s, "count")] < 2 {
				return false
			}
		}
		return true
	})
	if !counted {
		t.Fatalf("the stages did not count both events within 20s: %v", mt)
	}
	after := []int{-1, 0, 0, 2} // the index of a stage that comes before each
	for i, s := range stages {
		if n := mt[fmt.Sprintf(s, "count")]; n != 2 {
			t.Errorf("%s = %v, want 2", fmt.Sprintf(s, "count"), n)
		}
		if b := after[i]; b >= 0 && mt[fmt.Sprintf(s, "sum")] < mt[fmt.Sprintf(stages[b], "sum")] {
			t.Errorf("%s = %v is below %s = %v", fmt.Sprintf(s, "sum"), mt[fmt.Sprintf(s, "sum")],
				fmt.Sprintf(stages[b], "sum"), mt[fmt.Sprintf(stages[b], "sum")])
		}
	}
}
