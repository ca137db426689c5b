package http_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// fakeLog is the log browser's side of fakeAdmin.
type fakeLog struct {
	queries []domain.LogQuery
	page    domain.LogPage
	err     error                       // returned by Browse when set
	commits map[string]domain.LogCommit // by id
	// tail, when set, is what TailLog passes on after the open; it ends
	// with tailErr when tail is closed. Unset, TailLog opens and returns.
	tail    chan *domain.LogCommit
	tailErr error
	history admin.History
}

func (f *fakeAdmin) Browse(_ context.Context, q domain.LogQuery) (domain.LogPage, error) {
	defer f.call(adminCall{Method: "Browse", ID: q.Cursor, Limit: int64(q.Limit)})()
	f.logs.queries = append(f.logs.queries, q)
	return f.logs.page, f.logs.err
}

func (f *fakeAdmin) LogCommit(_ context.Context, id string) (domain.LogCommit, bool, error) {
	defer f.call(adminCall{Method: "LogCommit", ID: id})()
	c, ok := f.logs.commits[id]
	return c, ok, nil
}

func (f *fakeAdmin) TailLog(ctx context.Context, fn func(*domain.LogCommit) error) error {
	f.call(adminCall{Method: "TailLog"})()
	f.mu.Lock()
	tail, tailErr := f.logs.tail, f.logs.tailErr
	f.mu.Unlock()
	if err := fn(nil); err != nil || tail == nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-tail:
			if !ok {
				return tailErr
			}
			if err := fn(c); err != nil {
				return err
			}
		}
	}
}

func (f *fakeAdmin) History(context.Context) (admin.History, error) {
	defer f.call(adminCall{Method: "History"})()
	return f.logs.history, nil
}

func testCommit(stream string, first int64) domain.LogCommit {
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	e := domain.Event{ID: fmt.Sprintf("%s-e%d", stream, first), StreamID: stream, StreamType: domain.StreamTypeOrder, Type: domain.TypeOrderApproved,
		Version: first, OccurredAt: at, RecordedAt: at, Data: domain.OrderApproved{},
		Metadata: domain.Metadata{CorrelationID: "corr-1", CausationID: "req-1", SchemaVersion: 1}}
	return domain.LogCommit{ID: fmt.Sprintf("%s:%010d", stream, first), StreamID: stream, StreamType: domain.StreamTypeOrder,
		FirstVersion: first, LastVersion: first, RecordedAt: at, Events: []domain.Event{e}}
}

// TestLogPage: the query's parameters reach the admin side as they were
// sent, the page comes back with its events' data, and bad parameters
// are one 422 naming each of them, before the admin side is asked.
func TestLogPage(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	e.admin.logs.page = domain.LogPage{Commits: []domain.LogCommit{testCommit("o-1", 2)}, Next: "next-1"}
	rec := e.call(t, http.MethodGet, "/v1/admin/log?limit=7&cursor=c-1&type=OrderApproved&stream_id=o-1&correlation_id=corr-1", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/admin/log: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	if got, want := e.admin.logs.queries, (domain.LogQuery{Cursor: "c-1", Limit: 7, StreamID: "o-1", Type: domain.TypeOrderApproved, CorrelationID: "corr-1"}); len(got) != 1 || got[0] != want {
		t.Errorf("queries %+v, want %+v", got, want)
	}
	var page struct {
		Commits []struct {
			ID           string `json:"id"`
			FirstVersion int64  `json:"first_version"`
			Events       []struct {
				Type     string          `json:"type"`
				Data     json.RawMessage `json:"data"`
				Metadata struct {
					CorrelationID string `json:"correlation_id"`
				} `json:"metadata"`
			} `json:"events"`
		} `json:"commits"`
		Next string `json:"next_cursor"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Commits) != 1 || page.Commits[0].ID != "o-1:0000000002" || page.Next != "next-1" || len(page.Commits[0].Events) != 1 ||
		page.Commits[0].Events[0].Type != domain.TypeOrderApproved || string(page.Commits[0].Events[0].Data) != "{}" ||
		page.Commits[0].Events[0].Metadata.CorrelationID != "corr-1" {
		t.Errorf("page %s", rec.Body)
	}

	e.call(t, http.MethodGet, "/v1/admin/log", "")
	if got := e.admin.logs.queries[1]; got != (domain.LogQuery{Limit: 50}) {
		t.Errorf("without parameters: %+v, want the newest 50", got)
	}

	before := len(e.admin.callsOf("Browse"))
	rec = e.call(t, http.MethodGet, "/v1/admin/log?limit=0&type=Nope&stream_id=a:b&correlation_id="+strings.Repeat("c", 129), "")
	wantProblem(t, rec, http.StatusUnprocessableEntity, "/problems/validation")
	for _, f := range []string{`"limit"`, `"type"`, `"stream_id"`, `"correlation_id"`} {
		if !strings.Contains(rec.Body.String(), f) {
			t.Errorf("the 422 does not name %s: %s", f, rec.Body)
		}
	}
	if p := readProblem(t, rec); !hasField(p, "type") || !strings.Contains(fieldDetail(p, "type"), domain.TypeOrderMarkedUnavailable) {
		t.Errorf("the 422 of an unknown type does not list the types: %+v", p.Errors)
	}
	// A misspelt filter would filter nothing: refused, named, before the
	// admin side is asked.
	rec = e.call(t, http.MethodGet, "/v1/admin/log?typ=OrderPlaced&stream_id=o-1", "")
	if p := wantProblem(t, rec, http.StatusUnprocessableEntity, "/problems/validation", "typ"); len(p.Errors) != 1 {
		t.Errorf("errors %+v, want only typ", p.Errors)
	}
	if len(e.admin.callsOf("Browse")) != before {
		t.Error("the admin side was asked with invalid parameters")
	}

	e.admin.logs.err = fmt.Errorf("cursor of another query: %w", domain.ErrValidation)
	rec = e.call(t, http.MethodGet, "/v1/admin/log?cursor=elsewhere", "")
	wantProblem(t, rec, http.StatusUnprocessableEntity, "/problems/validation")
	if !strings.Contains(rec.Body.String(), `"cursor"`) {
		t.Errorf("a foreign cursor's 422 does not name it: %s", rec.Body)
	}
}

// TestLogCommit: one commit by id; an id that cannot be a commit's is 404
// without asking the admin side.
func TestLogCommit(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	e.admin.logs.commits = map[string]domain.LogCommit{"o-1:0000000001": testCommit("o-1", 1)}
	rec := e.call(t, http.MethodGet, "/v1/admin/log/commits/o-1:0000000001", "")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"id":"o-1:0000000001"`) {
		t.Fatalf("GET the commit: %d %s", rec.Code, rec.Body)
	}
	wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/log/commits/o-1:0000000009", ""), http.StatusNotFound, "/problems/not-found")
	asked := len(e.admin.callsOf("LogCommit"))
	for _, id := range []string{"o-1", "o-1:1", "o%201:0000000001", "o-1:00000000010"} {
		wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/log/commits/"+id, ""), http.StatusNotFound, "/problems/not-found")
	}
	if got := len(e.admin.callsOf("LogCommit")); got != asked {
		t.Errorf("ids that cannot be a commit's reached the admin side: %d calls", got-asked)
	}
}

// fieldDetail returns the detail of field f in p, "" when p has none.
func fieldDetail(p orderhttp.Problem, f string) string {
	for _, fe := range p.Errors {
		if fe.Field == f {
			return fe.Detail
		}
	}
	return ""
}

// tailEvents opens the log's event stream at url (with its query) and
// returns the response and a reader of its events: each call returns the
// next event's name and data.
func tailEvents(t *testing.T, ctx context.Context, url string) (*http.Response, func() (string, string)) {
	t.Helper()
	rq, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	rq.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Body.Close() })
	lines := bufio.NewScanner(res.Body)
	return res, func() (string, string) {
		t.Helper()
		var event, data string
		for lines.Scan() {
			switch l := lines.Text(); {
			case l == "" && event != "":
				return event, data
			case strings.HasPrefix(l, "event: "):
				event = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				data = strings.TrimPrefix(l, "data: ")
			}
		}
		t.Fatalf("the stream ended: %v", lines.Err())
		return "", ""
	}
}

// TestLogTailFilters: the tail takes the filters of a page of the log and
// sends only the commits that pass all of them; a bad filter, or a
// parameter the tail does not take, is a 422 before any stream opens.
func TestLogTailFilters(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close)

	// No tail set yet: a stream opened by mistake ends after its open.
	for _, tc := range []struct{ query, field string }{
		{"type=OrderUnavailable", "type"},
		{"limit=5", "limit"},
		{"typ=OrderPlaced", "typ"},
		{"stream_id=a:b", "stream_id"},
	} {
		rec := e.call(t, http.MethodGet, "/v1/admin/log/tail?"+tc.query, "")
		p := wantProblem(t, rec, http.StatusUnprocessableEntity, "/problems/validation", tc.field)
		if tc.field == "type" && !strings.Contains(fieldDetail(p, "type"), domain.TypeOrderMarkedUnavailable) {
			t.Errorf("?%s: the 422 does not list the types: %+v", tc.query, p.Errors)
		}
	}
	if n := len(e.admin.callsOf("TailLog")); n != 0 {
		t.Errorf("refused queries opened %d tails", n)
	}

	tail := make(chan *domain.LogCommit)
	e.admin.mu.Lock()
	e.admin.logs.tail = tail
	e.admin.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, next := tailEvents(t, ctx, srv.URL+"/v1/admin/log/tail?type=OrderPlaced&stream_id=o-2&correlation_id=corr-1")
	if ev, _ := next(); ev != "open" {
		t.Fatalf("first event %q, want open", ev)
	}
	placed := func(c domain.LogCommit) domain.LogCommit {
		c.Events[0].Type = domain.TypeOrderPlaced
		return c
	}
	otherCorr := placed(testCommit("o-2", 3))
	otherCorr.Events[0].Metadata.CorrelationID = "corr-2"
	want := placed(testCommit("o-2", 1))
	for _, c := range []domain.LogCommit{placed(testCommit("o-1", 1)), testCommit("o-2", 2), otherCorr, want} {
		select {
		case tail <- &c:
		case <-ctx.Done():
			t.Fatal("the handler took no commit")
		}
	}
	ev, data := next()
	var got struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(data), &got); err != nil || ev != "commit" || got.ID != want.ID {
		t.Errorf("first event after the open %q %s, want the only commit that passes the filters, %s", ev, data, want.ID)
	}
	if !strings.Contains(data, `"recorded_at":"2026-11-27T10:00:00.000Z"`) {
		t.Errorf("the commit's recorded_at is not written with milliseconds: %s", data)
	}
}

// TestLogTailNotSlow: a tail lasts as long as its client keeps it open;
// when the client closes it, its request line is not a slow request's
// warning, while any other request slower than SlowRequest still is.
func TestLogTailNotSlow(t *testing.T) {
	e := newAdminEnv(t, adminToken, func(c *orderhttp.Config) { c.SlowRequest = time.Nanosecond })
	e.admin.mu.Lock()
	e.admin.logs.tail = make(chan *domain.LogCommit) // an idle log
	e.admin.mu.Unlock()
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	res, next := tailEvents(t, ctx, srv.URL+"/v1/admin/log/tail")
	if ev, _ := next(); ev != "open" {
		t.Fatalf("first event %q, want open", ev)
	}
	cancel() // the client closes the stream
	_ = res.Body.Close()
	srv.Close() // returns once every request has ended, and been logged
	var line string
	for _, l := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(l, "msg=request") && strings.Contains(l, "route=/v1/admin/log/tail") {
			line = l
		}
	}
	if !strings.Contains(line, "level=DEBUG") {
		t.Errorf("the closed tail's request line %q, want one at debug", line)
	}
	if rec := e.call(t, http.MethodGet, "/v1/admin/history", ""); rec.Code != http.StatusOK {
		t.Fatalf("history: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(e.log.String(), "level=WARN msg=request method=GET route=/v1/admin/history") {
		t.Errorf("a slow request is no longer a warning:\n%s", e.log)
	}
}

// TestLogTail reads the event stream from a real server: the open, each
// commit as the change stream delivers it, and a failure of the stream as
// an error event that ends the response.
func TestLogTail(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	tail := make(chan *domain.LogCommit)
	e.admin.mu.Lock()
	e.admin.logs.tail, e.admin.logs.tailErr = tail, fmt.Errorf("tail the log: %w", domain.ErrUnavailable)
	e.admin.mu.Unlock()
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	rq, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/admin/log/tail", nil)
	rq.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("tail: %d %q", res.StatusCode, ct)
	}
	lines := bufio.NewScanner(res.Body)
	// next reads one event: its name and data.
	next := func() (string, string) {
		t.Helper()
		var event, data string
		for lines.Scan() {
			switch l := lines.Text(); {
			case l == "" && event != "":
				return event, data
			case strings.HasPrefix(l, "event: "):
				event = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				data = strings.TrimPrefix(l, "data: ")
			}
		}
		t.Fatalf("the stream ended: %v", lines.Err())
		return "", ""
	}
	if ev, data := next(); ev != "open" || data != "{}" {
		t.Fatalf("first event %q %q, want open", ev, data)
	}
	for _, v := range []int64{1, 2} {
		c := testCommit("o-7", v)
		select {
		case tail <- &c:
		case <-ctx.Done():
			t.Fatal("the handler took no commit")
		}
		ev, data := next()
		var got domain.LogCommit
		if err := json.Unmarshal([]byte(data), &struct {
			ID *string `json:"id"`
		}{&got.ID}); err != nil || ev != "commit" || got.ID != c.ID {
			t.Fatalf("event %q %s, want commit %s", ev, data, c.ID)
		}
	}
	close(tail)
	ev, data := next()
	if ev != "error" || !strings.Contains(data, `"status":503`) {
		t.Errorf("after the stream failed: %q %s, want an error event with a 503 problem", ev, data)
	}
	if lines.Scan() {
		for lines.Text() == "" && lines.Scan() {
		}
		if lines.Text() != "" {
			t.Errorf("the stream goes on after its error: %q", lines.Text())
		}
	}
	if err := lines.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("reading the stream's end: %v", err)
	}
}

// TestHistoryRoute: the admin side's samples as JSON.
func TestHistoryRoute(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	lag, age := uint64(4), 1.5
	e.admin.logs.history = admin.History{IntervalSeconds: 5, WindowSeconds: 3600, Samples: []admin.HistorySample{{
		At: time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC), Projections: []admin.ProjectionSample{{Name: "order_summaries", Lag: &lag}},
		Relay: admin.RelaySample{Owner: "i-1", CheckpointAgeSeconds: &age}}}}
	rec := e.call(t, http.MethodGet, "/v1/admin/history", "")
	want := `{"interval_seconds":5,"window_seconds":3600,"samples":[{"at":"2026-11-27T10:00:00.000Z","projections":[{"name":"order_summaries","lag":4,"lag_seconds":null,"apply_rate":null}],"relay":{"owner":"i-1","checkpoint_age_seconds":1.5,"catchups":null}}]}`
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != want {
		t.Errorf("history: %d %s\nwant %s", rec.Code, rec.Body, want)
	}
}

// TestLogTailEndsOnShutdown: an open event stream does not hold the
// server's shutdown: Shutdown ends it and returns within its bound.
func TestLogTailEndsOnShutdown(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	e.admin.mu.Lock()
	e.admin.logs.tail = make(chan *domain.LogCommit) // never sends: an idle log
	e.admin.mu.Unlock()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	rq, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+ln.Addr().String()+"/v1/admin/log/tail", nil)
	rq.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	lines := bufio.NewScanner(res.Body)
	if !lines.Scan() || lines.Text() != "event: open" {
		t.Fatalf("first line %q, want the open", lines.Text())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with an event stream open: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
	for lines.Scan() {
	}
}
