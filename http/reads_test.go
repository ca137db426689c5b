package http_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

func TestGetOrder(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-1")
	e.run(t, "o-1", "approve", "invoice")

	rec := e.get(t, "/v1/orders/o-1")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET order: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	if et := rec.Header().Get("ETag"); et != `"3"` {
		t.Errorf("ETag = %q, want \"3\"", et)
	}
	var o domain.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	if o.ID != "o-1" || o.Version != 3 || o.Status != domain.StatusInvoiced || o.CustomerID != "c-1" ||
		o.TotalCents != 2*1250+300 || o.ApprovedAt == nil || o.InvoicedAt == nil {
		t.Errorf("order = %+v", o)
	}

	rec = e.get(t, "/v1/orders/o-1/events")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET events: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	if et := rec.Header().Get("ETag"); et != `"3"` {
		t.Errorf("ETag = %q, want \"3\"", et)
	}
	var body struct {
		OrderID string            `json:"order_id"`
		Version int64             `json:"version"`
		Events  []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.OrderID != "o-1" || body.Version != 3 || len(body.Events) != 3 {
		t.Fatalf("events body = %s", rec.Body)
	}
	types := []string{domain.TypeOrderPlaced, domain.TypeOrderApproved, domain.TypeOrderInvoiced}
	for i, raw := range body.Events {
		ev, err := domain.UnmarshalEvent(raw)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if ev.Version != int64(i+1) || ev.Type != types[i] || ev.StreamID != "o-1" {
			t.Errorf("event %d = v%d %s of %s, want v%d %s of o-1", i, ev.Version, ev.Type, ev.StreamID, i+1, types[i])
		}
	}

	for _, path := range []string{"/v1/orders/nope", "/v1/orders/nope/events"} {
		wantProblem(t, e.get(t, path), http.StatusNotFound, "/problems/not-found")
	}
}

func summary(id string, v int64) domain.Order {
	return domain.Order{ID: id, CustomerID: "c-1", Status: domain.StatusCreated, Currency: "BRL", Version: v}
}

func TestSummaryMinVersion(t *testing.T) {
	tests := []struct {
		name    string
		query   string
		have    *domain.Order // the summary now; nil for none
		later   *domain.Order // the summary after 50ms
		status  int
		version int64 // X-Read-Model-Version and the body's version
		stale   bool
		minTime time.Duration // the answer takes at least this long
		delay   time.Duration // when later appears [50ms]
		waited  bool          // counted in orderd_summary_event_age_seconds: it waited, then got min_version
	}{
		{name: "no min_version", have: ptr(summary("o-1", 3)), status: 200, version: 3},
		{name: "reached", query: "?min_version=3", have: ptr(summary("o-1", 3)), status: 200, version: 3},
		{name: "passed", query: "?min_version=2&wait=0s", have: ptr(summary("o-1", 3)), status: 200, version: 3},
		{name: "min_version 0", query: "?min_version=0", have: ptr(summary("o-1", 3)), status: 200, version: 3},
		{name: "reached after a delay", query: "?min_version=4&wait=5s", have: ptr(summary("o-1", 3)), later: ptr(summary("o-1", 4)),
			status: 200, version: 4, minTime: 40 * time.Millisecond, waited: true},
		{name: "created after a delay", query: "?min_version=1&wait=5s", later: ptr(summary("o-1", 1)),
			status: 200, version: 1, minTime: 40 * time.Millisecond, waited: true},
		{name: "never reached", query: "?min_version=9&wait=100ms", have: ptr(summary("o-1", 3)),
			status: 200, version: 3, stale: true, minTime: 100 * time.Millisecond},
		{name: "reached too late", query: "?min_version=4&wait=10ms", have: ptr(summary("o-1", 3)), later: ptr(summary("o-1", 4)),
			delay: time.Second, status: 200, version: 3, stale: true, minTime: 10 * time.Millisecond},
		{name: "wait 0 is one look", query: "?min_version=9&wait=0s", have: ptr(summary("o-1", 3)), status: 200, version: 3, stale: true},
		{name: "absent", status: 404},
		{name: "absent with min_version", query: "?min_version=1&wait=30ms", status: 404, minTime: 30 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if tt.have != nil {
				e.reads.put(*tt.have)
			}
			if tt.delay == 0 {
				tt.delay = 50 * time.Millisecond
			}
			start := time.Now()
			if tt.later != nil {
				e.reads.putAfter(tt.delay, *tt.later)
			}
			rec := e.get(t, "/v1/order-summaries/o-1"+tt.query)
			took := time.Since(start)
			if took < tt.minTime {
				t.Errorf("answered after %v, want at least %v", took, tt.minTime)
			}
			if took > 3*time.Second {
				t.Errorf("answered after %v: the wait is not bounded", took)
			}
			if n := histogramCount(t, e.reg, "orderd_summary_event_age_seconds"); n != map[bool]uint64{true: 1}[tt.waited] {
				t.Errorf("orderd_summary_event_age_seconds counted %d reads, want %d", n, map[bool]uint64{true: 1}[tt.waited])
			}
			if tt.status == http.StatusNotFound {
				wantProblem(t, rec, http.StatusNotFound, "/problems/not-found")
				return
			}
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			wantJSON(t, rec)
			if v := rec.Header().Get("X-Read-Model-Version"); v != fmt.Sprint(tt.version) {
				t.Errorf("X-Read-Model-Version = %q, want %d", v, tt.version)
			}
			if s := rec.Header().Get("X-Read-Model-Stale"); (s == "true") != tt.stale {
				t.Errorf("X-Read-Model-Stale = %q, want stale=%v", s, tt.stale)
			}
			var o domain.Order
			if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || o.ID != "o-1" || o.Version != tt.version {
				t.Errorf("body %s (%v), want o-1 at version %d", rec.Body, err, tt.version)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// histogramCount is the number of observations of the histogram name in
// reg, 0 when it has none.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestSummaryDefaultWait: without ?wait the configured SummaryWait bounds
// the wait.
func TestSummaryDefaultWait(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) { c.SummaryWait = 60 * time.Millisecond })
	e.reads.put(summary("o-1", 1))
	start := time.Now()
	rec := e.get(t, "/v1/order-summaries/o-1?min_version=2")
	if took := time.Since(start); took < 60*time.Millisecond || took > 2*time.Second {
		t.Errorf("answered after %v, want about 60ms", took)
	}
	if rec.Code != http.StatusOK || rec.Header().Get("X-Read-Model-Stale") != "true" {
		t.Errorf("%d stale=%q, want 200 stale", rec.Code, rec.Header().Get("X-Read-Model-Stale"))
	}
}

func TestSummaryInvalidQuery(t *testing.T) {
	tests := []struct {
		query string
		field string
	}{
		{"?min_version=-1", "min_version"},
		{"?min_version=abc", "min_version"},
		{"?min_version=1.5", "min_version"},
		{"?min_version=9223372036854775808", "min_version"},
		{"?min_version=%7B%22%24gt%22%3A0%7D", "min_version"},
		{"?min_version=1&wait=-1s", "wait"},
		{"?min_version=1&wait=soon", "wait"},
		{"?min_version=1&wait=10", "wait"},
		{"?min_version=1&wait=31s", "wait"},
		{"?min_version=1&wait=1h", "wait"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			e := newEnv(t)
			e.reads.put(summary("o-1", 1))
			wantProblem(t, e.get(t, "/v1/order-summaries/o-1"+tt.query), http.StatusUnprocessableEntity, "/problems/validation", tt.field)
			if e.reads.calls != 0 {
				t.Errorf("the read model was asked %d times", e.reads.calls)
			}
		})
	}
}

func TestSummaryReadModelDown(t *testing.T) {
	e := newEnv(t)
	e.reads.err = fmt.Errorf("find summary: %w", domain.ErrUnavailable)
	for _, path := range []string{"/v1/order-summaries/o-1", "/v1/order-summaries", "/v1/customers/c-1/order-stats"} {
		wantProblem(t, e.get(t, path), http.StatusServiceUnavailable, "/problems/unavailable")
	}
}

type page struct {
	Items      []domain.Order `json:"items"`
	NextCursor *string        `json:"next_cursor"`
}

func TestListPagination(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{"o-3", "o-1", "o-5", "o-2", "o-4"} {
		e.reads.put(summary(id, 1))
	}
	var seen []string
	path := "/v1/order-summaries?limit=2"
	for pages := 0; ; pages++ {
		if pages == 5 {
			t.Fatalf("no last page after %d pages; saw %v", pages, seen)
		}
		rec := e.get(t, path)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		wantJSON(t, rec)
		var p page
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Items) == 0 || len(p.Items) > 2 {
			t.Fatalf("page %d has %d items", pages, len(p.Items))
		}
		for _, o := range p.Items {
			seen = append(seen, o.ID)
		}
		if p.NextCursor == nil {
			break
		}
		if len(p.Items) != 2 {
			t.Errorf("a page of %d items before the last", len(p.Items))
		}
		path = "/v1/order-summaries?limit=2&cursor=" + url.QueryEscape(*p.NextCursor)
	}
	if fmt.Sprint(seen) != "[o-1 o-2 o-3 o-4 o-5]" {
		t.Errorf("walked %v, want each of o-1..o-5 once, in order", seen)
	}
	for _, c := range e.reads.lists {
		if c.limit != 3 {
			t.Errorf("read model asked for %d, want limit+1 = 3", c.limit)
		}
	}
}

func TestListExactPage(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{"o-1", "o-2"} {
		e.reads.put(summary(id, 1))
	}
	rec := e.get(t, "/v1/order-summaries?limit=2")
	var p page
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || len(p.Items) != 2 || p.NextCursor != nil {
		t.Errorf("two items with limit 2: %s, want both and no next_cursor", rec.Body)
	}
}

func TestListFilters(t *testing.T) {
	e := newEnv(t)
	e.reads.put(summary("o-1", 1))
	shipped := summary("o-2", 4)
	shipped.Status = domain.StatusShipped
	e.reads.put(shipped)
	other := summary("o-3", 1)
	other.CustomerID = "c-2"
	e.reads.put(other)

	tests := []struct {
		query string
		want  string
	}{
		{"", "[o-1 o-2 o-3]"},
		{"?status=shipped", "[o-2]"},
		{"?customer_id=c-2", "[o-3]"},
		{"?customer_id=c-1&status=created", "[o-1]"},
		{"?customer_id=c-9", "[]"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			rec := e.get(t, "/v1/order-summaries"+tt.query)
			var p page
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != http.StatusOK {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			ids := []string{}
			for _, o := range p.Items {
				ids = append(ids, o.ID)
			}
			if fmt.Sprint(ids) != tt.want {
				t.Errorf("items %v, want %s", ids, tt.want)
			}
			last := e.reads.lists[len(e.reads.lists)-1]
			if last.limit != 51 {
				t.Errorf("default limit: read model asked for %d, want 51", last.limit)
			}
		})
	}
}

func TestListInvalidQuery(t *testing.T) {
	cursor := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		query  string
		fields []string
	}{
		{"?status=lost", []string{"status"}},
		{"?status=CREATED", []string{"status"}},
		{"?status=%7B%22%24ne%22%3A%22%22%7D", []string{"status"}},
		{"?limit=0", []string{"limit"}},
		{"?limit=-1", []string{"limit"}},
		{"?limit=501", []string{"limit"}},
		{"?limit=abc", []string{"limit"}},
		{"?limit=99999999999999999999", []string{"limit"}},
		{"?cursor=%21%21%21", []string{"cursor"}},
		{"?cursor=" + cursor("a.b"), []string{"cursor"}},
		{"?cursor=" + cursor("$where"), []string{"cursor"}},
		{"?cursor=" + base64.StdEncoding.EncodeToString([]byte("o-12")), []string{"cursor"}}, // padded
		{"?customer_id=a.b", []string{"customer_id"}},
		{"?customer_id=%24where", []string{"customer_id"}},
		{"?status=lost&limit=0&cursor=%3F&customer_id=a.b", []string{"status", "limit", "cursor", "customer_id"}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			e := newEnv(t)
			wantProblem(t, e.get(t, "/v1/order-summaries"+tt.query), http.StatusUnprocessableEntity, "/problems/validation", tt.fields...)
			if len(e.reads.lists) != 0 {
				t.Errorf("the read model was queried: %+v", e.reads.lists)
			}
		})
	}
}

func TestCustomerStats(t *testing.T) {
	e := newEnv(t)
	st := domain.CustomerOrderStats{CustomerID: "c-1", OrderCount: 2,
		ByStatus:           map[domain.Status]int64{domain.StatusCreated: 1, domain.StatusCanceled: 1},
		LifetimeValueCents: map[string]int64{"BRL": 2800}}
	e.reads.stats["c-1"] = st

	rec := e.get(t, "/v1/customers/c-1/order-stats")
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	var got domain.CustomerOrderStats
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(st) {
		t.Errorf("stats = %+v, want %+v", got, st)
	}
	wantProblem(t, e.get(t, "/v1/customers/c-2/order-stats"), http.StatusNotFound, "/problems/not-found")
}

// TestParametersAsTheDocumentBindsThem: the routes bind their parameters
// as openapi.json declares them (package api). A path id is
// percent-decoded before it is checked; a single-valued query parameter
// given twice is malformed (400), not a choice of one of the two.
func TestParametersAsTheDocumentBindsThem(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-1")
	if rec := e.get(t, "/v1/orders/o%2D1"); rec.Code != http.StatusOK {
		t.Errorf("GET /v1/orders/o%%2D1: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{
		"/v1/orders/o-1?as_of_version=1&as_of_version=2",
		"/v1/order-summaries?limit=1&limit=2",
		"/v1/daily-sales?from=2017-10-01&from=2017-10-02&to=2017-10-31",
	} {
		wantProblem(t, e.get(t, path), http.StatusBadRequest, "/problems/malformed")
	}
}
