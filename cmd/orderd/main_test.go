package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/mongodb/storetest"
)

// closed records the Mains a test closed itself, so the cleanup does not
// close them twice.
var closed sync.Map

// runMain boots the whole program on loopback port 0 with its data in a
// temp dir, and closes it when the test ends.
func runMain(t testing.TB) *Main {
	t.Helper()
	return runMainDir(t, t.TempDir())
}

// runMainDir boots Main with its data under dir, after opts have changed
// its config. The cleanup closes it unless closeMain already did; it is
// registered after dir was made, so it runs before a t.TempDir is removed.
func runMainDir(t testing.TB, dir string, opts ...func(*Config)) *Main {
	t.Helper()
	return bootMain(t, dir, false, opts...)
}

// runMainEmbedded is runMainDir with the embedded store always in this
// process, as `orderd` runs it: for the tests of the embedded mode itself.
func runMainEmbedded(t testing.TB, dir string, opts ...func(*Config)) *Main {
	t.Helper()
	return bootMain(t, dir, true, opts...)
}

// testMain returns a Main, not yet run, on embedded servers with their
// data under dir, listening on free loopback ports, logging to the test.
func testMain(t testing.TB, dir string) *Main {
	m := NewMain()
	m.Config.HTTPAddr = "127.0.0.1:0"
	m.Config.Embedded.DataDir = dir
	m.Config.Embedded.StoreAddr = "127.0.0.1:0"
	m.Config.Embedded.NATSAddr = "127.0.0.1:-1"
	m.Log = testLogger(t)
	m.Out = new(bytes.Buffer) // the embedded mode's start-up summary, for TestMain_EmbeddedSummary
	return m
}

// bootMain boots Main. Under the race detector, unless inProcess or the
// options name a store, the embedded store runs beside the test process on
// the same data dir (storetest.StartStoreProcess): in-process, FerretDB
// and SQLite run under the detector too, about ten times slower, and that
// was most of this package's CPU time. ORDERD_TEST_STORE=inprocess keeps it
// in.
func bootMain(t testing.TB, dir string, inProcess bool, opts ...func(*Config)) *Main {
	t.Helper()
	m := testMain(t, dir)
	m.Config.Roles = "all"
	m.Config.InstanceID = "test-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	for _, o := range opts {
		o(&m.Config)
	}
	if m.Config.Mongo.URI == "" && !inProcess && storetest.RaceBuild && os.Getenv("ORDERD_TEST_STORE") != "inprocess" {
		p, err := storetest.StartStoreProcess(filepath.Join(dir, "store"), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() }) // if Main did not start
		storeProcs.Store(m, p)
		m.Config.Mongo.URI = p.URI
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := m.Run(ctx); err != nil {
		_ = m.Close()
		t.Fatalf("Main.Run: %v", err)
	}
	t.Cleanup(func() {
		if _, done := closed.Load(m); !done {
			start := time.Now()
			if err := m.Close(); err != nil {
				t.Errorf("Main.Close: %v", err)
			}
			closeStore(m)
			t.Logf("Main.Close took %v", time.Since(start).Round(time.Millisecond))
		}
	})
	return m
}

// closeMain closes m now; the cleanup then leaves it alone.
func closeMain(t testing.TB, m *Main) {
	t.Helper()
	closed.Store(m, true)
	start := time.Now()
	if err := m.Close(); err != nil {
		t.Fatalf("Main.Close: %v", err)
	}
	closeStore(m)
	t.Logf("Main.Close took %v", time.Since(start).Round(time.Millisecond))
}

// storeProcs holds the store process of a Main that has one (bootMain).
var storeProcs sync.Map // *Main -> *storetest.StoreProcess

// closeStore stops m's store process, if any, after m closed: a Main
// booted again on the same data dir starts its own.
func closeStore(m *Main) {
	if p, ok := storeProcs.LoadAndDelete(m); ok {
		_ = p.(*storetest.StoreProcess).Close()
	}
}

// testLogger logs the program's warnings and errors through t.Log (of
// FerretDB's only errors: it warns of every command it does not know, such
// as the driver's endSessions), and nothing once the test has ended.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop) // registered before Close's cleanup: runs after it
	return slog.New(quietFerret{Handler: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})})
}

// quietFerret passes FerretDB's records (component=ferretdb) only from
// level Error.
type quietFerret struct {
	slog.Handler
	ferret bool
}

func (h quietFerret) Enabled(ctx context.Context, l slog.Level) bool {
	return (!h.ferret || l >= slog.LevelError) && h.Handler.Enabled(ctx, l)
}

func (h quietFerret) WithAttrs(as []slog.Attr) slog.Handler {
	ferret := h.ferret
	for _, a := range as {
		ferret = ferret || a.Key == "component" && a.Value.String() == "ferretdb"
	}
	return quietFerret{h.Handler.WithAttrs(as), ferret}
}

func (h quietFerret) WithGroup(g string) slog.Handler {
	return quietFerret{h.Handler.WithGroup(g), h.ferret}
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

// logged counts, per test, the records its Mains logged: warnings and
// errors, the only levels testLogger lets through.
var logged sync.Map // testing.TB -> *atomic.Int64

// warnings returns how many warnings and errors t's Mains have logged.
func warnings(t testing.TB) int64 {
	n, _ := logged.LoadOrStore(t, new(atomic.Int64))
	return n.(*atomic.Int64).Load()
}

func (w *testWriter) Write(p []byte) (int, error) {
	n, _ := logged.LoadOrStore(w.t, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// client is a small REST client of one Main.
type client struct {
	t    testing.TB
	base string
	http *http.Client
}

func newClient(t testing.TB, m *Main) *client {
	return &client{t: t, base: "http://" + m.HTTPAddr, http: &http.Client{Timeout: 45 * time.Second}}
}

// response is an answer read in full.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body))
}

// decode unmarshals the body into v, failing the test on error.
func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %q: %v", r.Body, err)
	}
}

// do sends a request; body "" sends none. header holds pairs of names and
// values (an empty value removes the header); Content-Type defaults to
// application/json when there is a body.
func (c *client) do(method, path, body string, header ...string) response {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i]) // e.g. no Content-Type at all
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// must sends a request and fails the test unless the status is want.
func (c *client) must(want int, method, path, body string, header ...string) response {
	c.t.Helper()
	r := c.do(method, path, body, header...)
	if r.Status != want {
		c.t.Fatalf("%s %s: got %v, want status %d", method, path, r, want)
	}
	return r
}

// commandAnswer is the body of a command's success.
type commandAnswer struct {
	OrderID string `json:"order_id"`
	Version int64  `json:"version"`
	Status  string `json:"status"`
}

// place places an order with one line and returns the answer.
func (c *client) place(orderID, customerID string, qty, price, freight int64) commandAnswer {
	c.t.Helper()
	body := fmt.Sprintf(`{"order_id":%q,"customer_id":%q,"currency":"BRL","items":[{"sku":"sku-1","quantity":%d,"unit_price_cents":%d}],"freight_cents":%d}`,
		orderID, customerID, qty, price, freight)
	if orderID == "" {
		body = strings.Replace(body, `"order_id":"",`, "", 1)
	}
	var a commandAnswer
	c.must(http.StatusCreated, "POST", "/v1/orders", body).decode(c.t, &a)
	return a
}

// step sends a lifecycle command with an empty body.
func (c *client) step(orderID, name string) commandAnswer {
	c.t.Helper()
	var a commandAnswer
	c.must(http.StatusOK, "POST", "/v1/orders/"+orderID+"/"+name, "").decode(c.t, &a)
	return a
}

// jsonValue unmarshals b into a generic JSON value for comparisons.
func jsonValue(t testing.TB, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("unmarshal %q: %v", b, err)
	}
	return v
}

// summaryEqualsOrder reads the summary at min_version (bounded wait) and
// the order folded from the log, and fails unless they are equal JSON.
func (c *client) summaryEqualsOrder(orderID string, version int64) any {
	c.t.Helper()
	s := c.must(http.StatusOK, "GET", fmt.Sprintf("/v1/order-summaries/%s?min_version=%d&wait=20s", orderID, version), "")
	if s.Header.Get("X-Read-Model-Stale") != "" {
		c.t.Fatalf("summary of %s still stale after 20s: %v", orderID, s)
	}
	if got := s.Header.Get("X-Read-Model-Version"); got != fmt.Sprint(version) {
		c.t.Errorf("summary of %s: X-Read-Model-Version %q, want %d", orderID, got, version)
	}
	o := c.must(http.StatusOK, "GET", "/v1/orders/"+orderID, "")
	sv, ov := jsonValue(c.t, s.Body), jsonValue(c.t, o.Body)
	if !reflect.DeepEqual(sv, ov) {
		c.t.Fatalf("summary of %s differs from the log fold:\nsummary %s\norder   %s", orderID, s.Body, o.Body)
	}
	return ov
}

// eventsOf returns the order's events as the API lists them.
func (c *client) eventsOf(orderID string) (version int64, events []struct {
	Type    string `json:"type"`
	Version int64  `json:"version"`
}) {
	c.t.Helper()
	var body struct {
		Version int64 `json:"version"`
		Events  []struct {
			Type    string `json:"type"`
			Version int64  `json:"version"`
		} `json:"events"`
	}
	c.must(http.StatusOK, "GET", "/v1/orders/"+orderID+"/events", "").decode(c.t, &body)
	return body.Version, body.Events
}

type customerStats struct {
	CustomerID         string           `json:"customer_id"`
	OrderCount         int64            `json:"order_count"`
	ByStatus           map[string]int64 `json:"by_status"`
	LifetimeValueCents map[string]int64 `json:"lifetime_value_cents"`
}

// waitFor calls done every interval until it returns true, for at most
// within, and reports whether it did. The caller fails the test, with
// what done saw last, when it did not.
func waitFor(within, interval time.Duration, done func() bool) bool {
	deadline := time.Now().Add(within)
	for !done() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

// waitStats polls the customer's stats until ok accepts them or 20s pass.
func (c *client) waitStats(customerID string, ok func(customerStats) bool) customerStats {
	c.t.Helper()
	var r response
	var s customerStats
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		r, s = c.do("GET", "/v1/customers/"+customerID+"/order-stats", ""), customerStats{}
		if r.Status == http.StatusOK {
			r.decode(c.t, &s)
			return ok(s)
		}
		if r.Status != http.StatusNotFound {
			c.t.Fatalf("customer %s stats: %v", customerID, r)
		}
		return false
	}) {
		c.t.Fatalf("customer %s stats not as expected within 20s; last answer %v", customerID, r)
	}
	return s
}

// TestMain_EndToEnd places, approves and ships an order over HTTP and
// reads it back from the log, the read models and the operational routes.
func TestMain_EndToEnd(t *testing.T) {
	m := runMain(t)
	c := newClient(t, m)

	r := c.must(http.StatusCreated, "POST", "/v1/orders",
		`{"customer_id":"cust-e2e","currency":"BRL","items":[{"sku":"sku-1","quantity":2,"unit_price_cents":1250},{"sku":"sku-2","quantity":1,"unit_price_cents":499}],"freight_cents":300}`)
	var placed commandAnswer
	r.decode(t, &placed)
	id := placed.OrderID
	if id == "" || placed.Version != 1 || placed.Status != "created" {
		t.Fatalf("place: %v", r)
	}
	// Random, not time-ordered: the log is range-sharded by stream_id
	// (deployments/sharding.md), and ordered ids would all land in the
	// top chunk.
	if u, err := uuid.Parse(id); err != nil || u.Version() != 4 {
		t.Errorf("server-made order id %q: version %v (%v), want a random UUID (version 4)", id, u.Version(), err)
	}
	if got := r.Header.Get("Location"); got != "/v1/orders/"+id {
		t.Errorf("Location %q, want /v1/orders/%s", got, id)
	}
	if got := r.Header.Get("ETag"); got != `"1"` {
		t.Errorf("ETag %q, want \"1\"", got)
	}
	if a := c.step(id, "approve"); a.Version != 2 || a.Status != "approved" {
		t.Fatalf("approve: %+v", a)
	}
	r = c.must(http.StatusOK, "POST", "/v1/orders/"+id+"/ship", `{"at":"2024-05-01T12:00:00Z"}`, "If-Match", `"2"`)
	var shipped commandAnswer
	r.decode(t, &shipped)
	if shipped.Version != 3 || shipped.Status != "shipped" || r.Header.Get("ETag") != `"3"` {
		t.Fatalf("ship: %v (ETag %q)", r, r.Header.Get("ETag"))
	}

	order := c.summaryEqualsOrder(id, 3).(map[string]any)
	want := map[string]any{"order_id": id, "customer_id": "cust-e2e", "status": "shipped", "currency": "BRL",
		"item_count": 3.0, "subtotal_cents": 2999.0, "freight_cents": 300.0, "total_cents": 3299.0,
		"shipped_at": "2024-05-01T12:00:00.000Z", "version": 3.0}
	for k, v := range want {
		if order[k] != v {
			t.Errorf("order %s = %v, want %v", k, order[k], v)
		}
	}

	st := c.waitStats("cust-e2e", func(s customerStats) bool { return s.ByStatus["shipped"] == 1 })
	if st.OrderCount != 1 || len(st.ByStatus) != 1 || st.LifetimeValueCents["BRL"] != 3299 || st.CustomerID != "cust-e2e" {
		t.Errorf("customer stats %+v", st)
	}

	version, events := c.eventsOf(id)
	wantTypes := []string{"OrderPlaced", "OrderApproved", "OrderShipped"}
	if version != 3 || len(events) != len(wantTypes) {
		t.Fatalf("events: version %d, %+v", version, events)
	}
	for i, e := range events {
		if e.Version != int64(i+1) || e.Type != wantTypes[i] {
			t.Errorf("event %d: %+v, want %s v%d", i, e, wantTypes[i], i+1)
		}
	}

	// The list of summaries finds it by customer and status.
	var list struct {
		Items []map[string]any `json:"items"`
	}
	c.must(http.StatusOK, "GET", "/v1/order-summaries?customer_id=cust-e2e&status=shipped", "").decode(t, &list)
	if len(list.Items) != 1 || list.Items[0]["order_id"] != id {
		t.Errorf("list of summaries: %+v", list.Items)
	}

	c.must(http.StatusOK, "GET", "/healthz", "")
	if r := c.must(http.StatusOK, "GET", "/readyz", ""); !strings.Contains(string(r.Body), `"store":"ok"`) || !strings.Contains(string(r.Body), `"bus":"ok"`) {
		t.Errorf("/readyz: %v", r)
	}
	metrics := string(c.must(http.StatusOK, "GET", "/metrics", "").Body)
	for _, name := range []string{"orderd_append_duration_seconds", "orderd_projection_events_applied_total", "orderd_commands_total"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestMain_BadRequestsAppendNothing sends requests the API must refuse and
// checks each answer's status and problem document, and that the log of
// the order they aimed at did not grow (invariant 8).
func TestMain_BadRequestsAppendNothing(t *testing.T) {
	m := runMain(t)
	c := newClient(t, m)
	id := c.place("order-bad-1", "cust-bad", 1, 1000, 0).OrderID
	c.place("order-bad-2", "cust-bad", 1, 1000, 0)
	c.step("order-bad-2", "approve")

	const ctJSON = "application/json"
	tests := []struct {
		name         string
		method, path string
		contentType  string
		body         string
		header       []string
		status       int
		problem      string
		fieldErrors  bool
	}{
		{"malformed JSON", "POST", "/v1/orders/" + id + "/approve", ctJSON, `{"at":`, nil, 400, "/problems/malformed", false},
		{"malformed place", "POST", "/v1/orders", ctJSON, `{"order_id":"order-bad-1",`, nil, 400, "/problems/malformed", false},
		{"trailing data", "POST", "/v1/orders/" + id + "/approve", ctJSON, `{} {}`, nil, 400, "/problems/malformed", false},
		{"wrong content type", "POST", "/v1/orders/" + id + "/approve", "text/plain", `{}`, nil, 415, "/problems/unsupported", false},
		{"no content type", "POST", "/v1/orders", "", `{"order_id":"order-bad-1","customer_id":"cust-bad","currency":"BRL","items":[{"sku":"sku-1","quantity":1,"unit_price_cents":1000}]}`, nil, 415, "/problems/unsupported", false},
		{"unknown field", "POST", "/v1/orders/" + id + "/approve", ctJSON, `{"at":"2024-01-01T00:00:00Z","by":"me"}`, nil, 400, "/problems/malformed", false},
		{"unknown field in place", "POST", "/v1/orders", ctJSON, `{"order_id":"order-bad-3","customer_id":"c","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":1,"color":"red"}]}`, nil, 400, "/problems/malformed", false},
		{"invalid time", "POST", "/v1/orders/" + id + "/approve", ctJSON, `{"at":"yesterday"}`, nil, 422, "/problems/validation", true},
		{"wrong type", "POST", "/v1/orders/" + id + "/cancel", ctJSON, `{"reason":42}`, nil, 422, "/problems/validation", true},
		{"invalid place", "POST", "/v1/orders", ctJSON, `{"order_id":"order-bad-1","customer_id":"cust bad","currency":"brl","items":[]}`, nil, 422, "/problems/validation", true},
		{"invalid place new id", "POST", "/v1/orders", ctJSON, `{"order_id":"order-bad-3","customer_id":"c","currency":"BRL","items":[{"sku":"s","quantity":0,"unit_price_cents":1}]}`, nil, 422, "/problems/validation", true},
		{"bad If-Match", "POST", "/v1/orders/" + id + "/approve", "", "", []string{"If-Match", "v1"}, 422, "/problems/validation", true},
		{"unknown order", "POST", "/v1/orders/order-nope/approve", "", "", nil, 404, "/problems/not-found", false},
		{"illegal transition", "POST", "/v1/orders/" + id + "/deliver", "", "", nil, 409, "/problems/invalid-transition", false},
		{"illegal transition from approved", "POST", "/v1/orders/order-bad-2/deliver", "", "", nil, 409, "/problems/invalid-transition", false},
		{"stale If-Match", "POST", "/v1/orders/" + id + "/approve", "", "", []string{"If-Match", `"7"`}, 412, "/problems/precondition-failed", false},
		{"stale If-Match on approved", "POST", "/v1/orders/order-bad-2/ship", "", "", []string{"If-Match", `"1"`}, 412, "/problems/precondition-failed", false},
		{"placed with other content", "POST", "/v1/orders", ctJSON, `{"order_id":"order-bad-1","customer_id":"cust-bad","currency":"BRL","items":[{"sku":"sku-1","quantity":2,"unit_price_cents":1000}]}`, nil, 409, "/problems/already-exists", false},
		{"unknown order read", "GET", "/v1/orders/order-nope", "", "", nil, 404, "/problems/not-found", false},
		{"invalid id read", "GET", "/v1/orders/no.such.id", "", "", nil, 404, "/problems/not-found", false},
		{"unknown summary", "GET", "/v1/order-summaries/order-nope", "", "", nil, 404, "/problems/not-found", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &client{t: t, base: c.base, http: c.http}
			h := append([]string(nil), tt.header...)
			if tt.body != "" {
				h = append(h, "Content-Type", tt.contentType)
			}
			r := c.do(tt.method, tt.path, tt.body, h...)
			if r.Status != tt.status {
				t.Fatalf("got %v, want status %d", r, tt.status)
			}
			if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q, want application/problem+json", ct)
			}
			var p struct {
				Type   string `json:"type"`
				Title  string `json:"title"`
				Status int    `json:"status"`
				Errors []struct {
					Field  string `json:"field"`
					Detail string `json:"detail"`
				} `json:"errors"`
			}
			r.decode(t, &p)
			if p.Type != tt.problem || p.Status != tt.status || p.Title == "" {
				t.Errorf("problem %+v, want type %s status %d and a title", p, tt.problem, tt.status)
			}
			if tt.fieldErrors != (len(p.Errors) > 0) {
				t.Errorf("errors %+v; want field details: %v", p.Errors, tt.fieldErrors)
			}
			for _, fe := range p.Errors {
				if fe.Field == "" || fe.Detail == "" {
					t.Errorf("field error without field or detail: %+v", fe)
				}
			}
		})
	}

	for id, want := range map[string][]string{
		"order-bad-1": {"OrderPlaced"},
		"order-bad-2": {"OrderPlaced", "OrderApproved"},
	} {
		version, events := c.eventsOf(id)
		if version != int64(len(want)) || len(events) != len(want) {
			t.Errorf("%s after the bad requests: version %d, events %+v; want %v", id, version, events, want)
		}
	}
	for _, id := range []string{"order-bad-3", "order-nope"} {
		c.must(http.StatusNotFound, "GET", "/v1/orders/"+id+"/events", "")
	}
	// The refusals are no obstacle to the next good command.
	if a := c.step("order-bad-1", "approve"); a.Version != 2 {
		t.Errorf("approve after the refusals: %+v", a)
	}
}

// TestMain_RestartKeepsData places orders, closes the program and boots
// it again on the same data dir: the log, the read models and the
// consumers' positions survive, and new commands are projected.
func TestMain_RestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	m := runMainDir(t, dir)
	c := newClient(t, m)
	ids := []string{"order-r-1", "order-r-2", "order-r-3"}
	for i, id := range ids {
		c.place(id, "cust-restart", int64(i+1), 1000, 100)
	}
	c.step("order-r-1", "approve")
	c.step("order-r-1", "ship")
	c.step("order-r-2", "approve")
	versions := map[string]int64{"order-r-1": 3, "order-r-2": 2, "order-r-3": 1}
	before := map[string]any{}
	for _, id := range ids {
		before[id] = c.summaryEqualsOrder(id, versions[id])
	}
	c.waitStats("cust-restart", func(s customerStats) bool { return s.OrderCount == 3 && s.ByStatus["shipped"] == 1 })
	firstAddr := m.HTTPAddr
	closeMain(t, m)

	m = runMainDir(t, dir)
	t.Logf("first boot on %s, second on %s", firstAddr, m.HTTPAddr)
	c = newClient(t, m)
	for _, id := range ids {
		after := c.summaryEqualsOrder(id, versions[id])
		if !reflect.DeepEqual(after, before[id]) {
			t.Errorf("%s changed over the restart:\nbefore %v\nafter  %v", id, before[id], after)
		}
	}
	st := c.waitStats("cust-restart", func(s customerStats) bool { return s.OrderCount == 3 })
	if st.ByStatus["shipped"] != 1 || st.ByStatus["approved"] != 1 || st.ByStatus["created"] != 1 || st.LifetimeValueCents["BRL"] != 6300 {
		t.Errorf("customer stats after the restart: %+v", st)
	}
	// Idempotency keys survive too, and the program keeps working.
	c.must(http.StatusOK, "POST", "/v1/orders/order-r-2/ship", "", "Idempotency-Key", "k-restart")
	r := c.must(http.StatusOK, "POST", "/v1/orders/order-r-2/ship", "", "Idempotency-Key", "k-restart")
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("repeated ship: no Idempotent-Replayed header: %v", r)
	}
	c.summaryEqualsOrder("order-r-2", 3)
	c.place("order-r-4", "cust-restart", 1, 1000, 0)
	c.summaryEqualsOrder("order-r-4", 1)
	c.waitStats("cust-restart", func(s customerStats) bool { return s.OrderCount == 4 && s.ByStatus["shipped"] == 2 })
}

// replayLimit is how many of the oldest Olist orders TestMain_OlistReplay
// replays: ORDERD_TEST_REPLAY_LIMIT when set, else 150, or 50 in a
// race-detector build, where the embedded store (SQLite transpiled to Go,
// run with checkptr) is about ten times slower and 150 orders took over 3
// minutes on the shared 2-core machine.
func replayLimit() int {
	if n, err := strconv.Atoi(os.Getenv("ORDERD_TEST_REPLAY_LIMIT")); err == nil && n > 0 {
		return n
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				return 50
			}
		}
	}
	return 150
}

// TestMain_OlistReplay replays the oldest Olist sample orders through the
// real service, then checks them again without sending anything.
func TestMain_OlistReplay(t *testing.T) {
	m := runMain(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n := replayLimit()
	cfg := olist.Config{Data: "../../testdata/olist-sample", URL: "http://" + m.HTTPAddr, Concurrency: 8, Limit: n,
		Timeout: 30 * time.Second}
	for _, checkOnly := range []bool{false, true} {
		cfg.CheckOnly = checkOnly
		rep, err := olist.Run(ctx, cfg)
		if err != nil {
			t.Fatalf("replay (check only %v): %v", checkOnly, err)
		}
		var b strings.Builder
		_ = rep.Print(&b)
		t.Logf("replay (check only %v):\n%s", checkOnly, b.String())
		if rep.Orders != n {
			t.Errorf("orders %d; want %d", rep.Orders, n)
		}
		if len(rep.Mismatches) != 0 || len(rep.Unexpected) != 0 || rep.Err() != nil {
			t.Errorf("replay (check only %v): %d mismatches, %d unexpected rejections", checkOnly, len(rep.Mismatches), len(rep.Unexpected))
		}
		if rep.Equal != n || rep.StatusOK != n {
			t.Errorf("equal %d, status as expected %d; want %d", rep.Equal, rep.StatusOK, n)
		}
		if checkOnly && rep.Commands != 0 {
			t.Errorf("check-only run sent %d commands", rep.Commands)
		}
		if !checkOnly && (rep.Commands < n || rep.Accepted == 0) {
			t.Errorf("replay sent %d commands, accepted %d", rep.Commands, rep.Accepted)
		}
	}
	// A healthy import is quiet: a warning would be work dropped and
	// redone (a relay round failed and published again from its
	// checkpoint, a projection partition's lease lost or fenced).
	if n := warnings(t); n != 0 {
		t.Errorf("the service logged %d warnings or errors during a healthy import (see the log above)", n)
	}
}

func TestRun_Help(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	for _, help := range []string{"help", "-h", "--help"} {
		stdout.Reset()
		if err := run(ctx, []string{help}, &stdout, &stderr); err != nil {
			t.Fatalf("orderd %s: %v", help, err)
		}
		for _, s := range []string{"Usage:", "orderd [serve]", "orderd import-olist", "orderd replay", "orderd rebuild", "orderd verify", "orderd status", "orderd loadgen", "orderd help"} {
			if !strings.Contains(stdout.String(), s) {
				t.Errorf("orderd %s lacks %q:\n%s", help, s, stdout.String())
			}
		}
		if stderr.Len() != 0 {
			t.Errorf("orderd %s wrote to stderr: %q", help, stderr.String())
		}
	}

	// serve's help names every variable it reads, the ones without a
	// flag too.
	stdout.Reset()
	stderr.Reset()
	if err := run(ctx, []string{"serve", "-h"}, &stdout, &stderr); err != nil {
		t.Fatalf("orderd serve -h: %v", err)
	}
	for _, v := range []string{"MONGODB_URI", "NATS_URL", "ORDERD_HTTP_ADDR", "ADMIN_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if !strings.Contains(stderr.String(), v) {
			t.Errorf("orderd serve -h does not name %s", v)
		}
	}

	// The Olist importer answers to its name and to "replay", which
	// scripts and make replay use.
	for _, cmd := range []string{"import-olist", "replay"} {
		stdout.Reset()
		stderr.Reset()
		if err := run(ctx, []string{cmd, "-h"}, &stdout, &stderr); err != nil || !strings.Contains(stderr.String(), "Usage: orderd import-olist") {
			t.Errorf("orderd %s -h: %v\n%s", cmd, err, stderr.String())
		}
	}

	stdout.Reset()
	stderr.Reset()
	err := run(ctx, []string{"frobnicate"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "frobnicate") || !strings.Contains(stderr.String(), "Usage:") {
		t.Errorf("unknown command: err %v, stderr %q", err, stderr.String())
	}
}

// A role that fails is restarted, so it cannot silently stop the others.
// TestSuperviseRestartDelays: a failing role waits 100 ms, doubling up to
// 10 s, and is retried for ever.
func TestSuperviseRestartDelays(t *testing.T) {
	d := restartDelays()
	var got []time.Duration
	for range 10 {
		got = append(got, d.NextBackOff())
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
}

func TestSuperviseRestartsFailedRole(t *testing.T) {
	m := NewMain()
	m.Log = slog.New(slog.DiscardHandler)
	m.health = newRoleHealth(prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	runs := 0
	err := m.supervise(ctx, "relay", "", func(ctx context.Context) error {
		runs++
		if runs < 3 {
			return errors.New("consumer not created")
		}
		cancel() // the third run lasts until shutdown
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil || runs != 3 {
		t.Fatalf("supervise = %v after %d runs; want nil after 3", err, runs)
	}
}
