package http_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	orderhttp "github.com/orderd/orderd/http"
)

// knownBugs turns the tests of bugs reported but not fixed yet from skips
// into failures: go test ./http -args -known-bugs
var knownBugs = flag.Bool("known-bugs", false, "run the tests of known, unfixed bugs instead of skipping them")

// knownBug skips the rest of a test that asserts the contract where the
// code is known to break it, unless -known-bugs is set. Delete the call
// when the bug is fixed.
func knownBug(t testing.TB, bug string) {
	t.Helper()
	if !*knownBugs {
		t.Skip("known bug, see the report: " + bug)
	}
}

// fakeReads is a ReadModels whose answers the test sets. A summary may be
// scheduled to change at a later time, to test ?min_version waits.
type fakeReads struct {
	mu        sync.Mutex
	summaries map[string]domain.Order
	later     map[string]laterSummary
	stats     map[string]domain.CustomerOrderStats
	sales     []domain.DailySales
	salesAsks []salesCall
	err       error         // returned by every call when set
	entered   chan struct{} // when set, Summary signals here, then waits for release
	release   chan struct{}
	calls     int
	lists     []listCall
}

type laterSummary struct {
	at time.Time
	o  domain.Order
}

type salesCall struct {
	from, to time.Time
	currency string
}

type listCall struct {
	customer, status, after string
	limit                   int
}

var _ orderhttp.ReadModels = (*fakeReads)(nil)

func newFakeReads() *fakeReads {
	return &fakeReads{summaries: map[string]domain.Order{}, later: map[string]laterSummary{},
		stats: map[string]domain.CustomerOrderStats{}}
}

func (f *fakeReads) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeReads) put(o domain.Order) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.summaries[o.ID] = o
}

// putAfter makes o the summary of its order once d has passed.
func (f *fakeReads) putAfter(d time.Duration, o domain.Order) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.later[o.ID] = laterSummary{at: time.Now().Add(d), o: o}
}

func (f *fakeReads) Summary(ctx context.Context, id string) (domain.Order, error) {
	f.mu.Lock()
	f.calls++
	entered, release := f.entered, f.release
	f.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return domain.Order{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return domain.Order{}, f.err
	}
	if l, ok := f.later[id]; ok && !time.Now().Before(l.at) {
		f.summaries[id] = l.o
		delete(f.later, id)
	}
	o, ok := f.summaries[id]
	if !ok {
		return domain.Order{}, fmt.Errorf("summary %s: %w", id, domain.ErrNotFound)
	}
	return o, nil
}

func (f *fakeReads) ListSummaries(_ context.Context, customer, status, after string, limit int) ([]domain.Order, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, listCall{customer, status, after, limit})
	if f.err != nil {
		return nil, f.err
	}
	out := []domain.Order{}
	for _, o := range f.summaries {
		if (customer == "" || o.CustomerID == customer) && (status == "" || string(o.Status) == status) && o.ID > after {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (f *fakeReads) CustomerStats(_ context.Context, id string) (domain.CustomerOrderStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return domain.CustomerOrderStats{}, f.err
	}
	st, ok := f.stats[id]
	if !ok {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", id, domain.ErrNotFound)
	}
	return st, nil
}

// DailySales answers the rows of f.sales in the range and currency.
func (f *fakeReads) DailySales(_ context.Context, from, to time.Time, currency string) ([]domain.DailySales, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.salesAsks = append(f.salesAsks, salesCall{from, to, currency})
	if f.err != nil {
		return nil, "", f.err
	}
	var out []domain.DailySales
	for _, r := range f.sales {
		if r.Day >= from.Format(time.DateOnly) && r.Day <= to.Format(time.DateOnly) && (currency == "" || r.Currency == currency) {
			out = append(out, r)
		}
	}
	return out, "daily_sales", nil
}

// env is one server over a real domain.Service, an in-memory store and the
// fake read models.
type env struct {
	srv   *orderhttp.Server
	h     http.Handler
	store *domaintest.MemStore
	reads *fakeReads
	reg   *prometheus.Registry
}

func newEnv(t testing.TB, mod ...func(*orderhttp.Config)) *env {
	t.Helper()
	e := &env{store: domaintest.NewMemStore(), reads: newFakeReads(), reg: prometheus.NewRegistry()}
	cfg := orderhttp.Config{
		Commands:   domain.NewService(e.store, nil),
		ReadModels: e.reads,
		Ready:      map[string]orderhttp.Check{},
		Gatherer:   e.reg,
		Registerer: e.reg,
	}
	for _, m := range mod {
		m(&cfg)
	}
	e.srv = orderhttp.NewServer(cfg)
	e.h = e.srv.Handler()
	return e
}

// req is a request to send. Body, when not empty, goes with Content-Type
// application/json unless Header sets Content-Type ("" to send none).
type req struct {
	Method, Path, Body string
	Header             map[string]string
}

func (e *env) do(t testing.TB, r req) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	hr := httptest.NewRequest(r.Method, r.Path, body)
	if _, set := r.Header["Content-Type"]; !set && r.Body != "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.Header {
		if v == "" && k == "Content-Type" {
			continue
		}
		hr.Header[http.CanonicalHeaderKey(k)] = []string{v}
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, hr)
	return rec
}

func (e *env) post(t testing.TB, path, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	h := map[string]string{}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return e.do(t, req{Method: http.MethodPost, Path: path, Body: body, Header: h})
}

func (e *env) get(t testing.TB, path string) *httptest.ResponseRecorder {
	t.Helper()
	return e.do(t, req{Method: http.MethodGet, Path: path})
}

// place places a valid order with id and fails the test unless it is
// created.
func (e *env) place(t testing.TB, id string) {
	t.Helper()
	if rec := e.post(t, "/v1/orders", placeBody(id)); rec.Code != http.StatusCreated {
		t.Fatalf("place %s: %d %s", id, rec.Code, rec.Body)
	}
}

// run posts the lifecycle commands to order id in turn and fails the test
// unless each succeeds.
func (e *env) run(t testing.TB, id string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if rec := e.post(t, "/v1/orders/"+id+"/"+c, ""); rec.Code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c, id, rec.Code, rec.Body)
		}
	}
}

// placeBody is a valid POST /v1/orders body; id "" leaves order_id out.
func placeBody(id string) string {
	return placeBodyWith(id, `"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250}], "freight_cents": 300`)
}

func placeBodyWith(id, fields string) string {
	if id == "" {
		return "{" + fields + "}"
	}
	return `{"order_id": "` + id + `", ` + fields + "}"
}

// commandAnswer is the body of a successful command.
type commandAnswer struct {
	OrderID string `json:"order_id"`
	Version int64  `json:"version"`
	Status  string `json:"status"`
}

// wantCommand checks a successful command answer: status, ETag, body.
func wantCommand(t testing.TB, rec *httptest.ResponseRecorder, status int, want commandAnswer, replayed bool) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	wantJSON(t, rec)
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &keys); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if len(keys) != 3 {
		t.Errorf("body %s: want exactly order_id, version, status", rec.Body)
	}
	var got commandAnswer
	_ = json.Unmarshal(rec.Body.Bytes(), &got)
	if want.OrderID == "" {
		want.OrderID = got.OrderID
	}
	if got != want {
		t.Errorf("body = %+v, want %+v", got, want)
	}
	if et, w := rec.Header().Get("ETag"), fmt.Sprintf(`"%d"`, want.Version); et != w {
		t.Errorf("ETag = %q, want %q", et, w)
	}
	if r := rec.Header().Get("Idempotent-Replayed"); (r == "true") != replayed {
		t.Errorf("Idempotent-Replayed = %q, want replayed=%v", r, replayed)
	}
}

func wantJSON(t testing.TB, rec *httptest.ResponseRecorder) {
	t.Helper()
	if mt, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type")); mt != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", rec.Header().Get("Content-Type"))
	}
}

// readProblem checks that rec is a problem document and returns it.
func readProblem(t testing.TB, rec *httptest.ResponseRecorder) orderhttp.Problem {
	t.Helper()
	if mt, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type")); mt != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json; body %s", rec.Header().Get("Content-Type"), rec.Body)
	}
	var p orderhttp.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != rec.Code {
		t.Errorf("problem status %d, response status %d", p.Status, rec.Code)
	}
	if !strings.HasPrefix(p.Type, "/problems/") || p.Title == "" {
		t.Errorf("problem %+v: want a type /problems/<slug> and a title", p)
	}
	return p
}

// wantProblem checks status, media type and problem type, and that every
// field in fields has a detail in the problem (matched exactly, or as a
// prefix when it ends in "*").
func wantProblem(t testing.TB, rec *httptest.ResponseRecorder, status int, typ string, fields ...string) orderhttp.Problem {
	t.Helper()
	if rec.Code != status {
		t.Errorf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	p := readProblem(t, rec)
	if p.Type != typ {
		t.Errorf("problem type = %q, want %q", p.Type, typ)
	}
	for _, f := range fields {
		if !hasField(p, f) {
			t.Errorf("problem has no error for field %q: %+v", f, p.Errors)
		}
	}
	return p
}

func hasField(p orderhttp.Problem, f string) bool {
	for _, fe := range p.Errors {
		if fe.Detail == "" {
			continue
		}
		if fe.Field == f || strings.HasSuffix(f, "*") && strings.HasPrefix(fe.Field, strings.TrimSuffix(f, "*")) {
			return true
		}
	}
	return false
}
