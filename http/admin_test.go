package http_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// adminToken is the bearer token of the admin test servers.
const adminToken = "s3cr3t-Admin-Token-7f4c9e"

// adminCall is one call the admin side received.
type adminCall struct {
	Method     string
	Projection string
	Partitions int
	Repair     bool
	Spec       jobs.ReplaySpec
	ID         string
	Limit      int64
}

// fakeAdmin is an in-memory Admin. It knows the projections order_summaries
// and customer_order_stats; a projection has one unfinished rebuild at a
// time; jobs and dead letters may be put in by the test.
type fakeAdmin struct {
	mu       sync.Mutex
	known    map[string]bool
	jobs     map[string]jobs.Job
	rebuild  map[string]string      // projection -> its unfinished rebuild
	dead     map[string]error       // dead letter id -> what a retry returns
	letters  []projector.DeadLetter // listed by DeadLetters
	statuses []admin.ProjectionStatus
	relay    outbox.RelayStatus
	checks   map[string][]projection.ReadModelCheck // order id -> what ReadModels returns
	err      error                                  // returned by Projections when set
	calls    []adminCall
	seq      int
	logs     fakeLog // the log browser's side (log_test.go)
}

var _ orderhttp.Admin = (*fakeAdmin)(nil)

func newFakeAdmin() *fakeAdmin {
	return &fakeAdmin{
		known:   map[string]bool{"order_summaries": true, "customer_order_stats": true},
		jobs:    map[string]jobs.Job{},
		rebuild: map[string]string{},
		dead:    map[string]error{},
		statuses: []admin.ProjectionStatus{
			{ProjectionStatus: jobs.ProjectionStatus{Name: "order_summaries", Version: 2, ActiveCollection: "order_summaries_v2_0193", ActiveVersion: 2,
				PreviousCollection: "order_summaries", PreviousVersion: 1, Generation: 3}},
			{ProjectionStatus: jobs.ProjectionStatus{Name: "customer_order_stats", ActiveCollection: "customer_order_stats", Generation: 1}},
		},
	}
}

// call locks f for one call of the Admin interface and records it; the
// method defers the unlock it returns.
func (f *fakeAdmin) call(c adminCall) (unlock func()) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	return f.mu.Unlock
}

// job returns the job id, or an error wrapping ErrNotFound.
func (f *fakeAdmin) job(id string) (jobs.Job, error) {
	job, ok := f.jobs[id]
	if !ok {
		return jobs.Job{}, fmt.Errorf("job %q: %w", id, domain.ErrNotFound)
	}
	return job, nil
}

// recorded returns the calls so far.
func (f *fakeAdmin) recorded() []adminCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]adminCall(nil), f.calls...)
}

// callsOf returns the calls of one method.
func (f *fakeAdmin) callsOf(method string) []adminCall {
	var out []adminCall
	for _, c := range f.recorded() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeAdmin) newJob(kind jobs.JobKind, projection string) jobs.Job {
	f.seq++
	return jobs.Job{ID: fmt.Sprintf("job-%d", f.seq), Kind: kind, Projection: projection,
		State: jobs.StateQueued, CreatedAt: time.Date(2025, 3, 1, 12, 0, f.seq, 0, time.UTC), Tasks: []jobs.Task{}}
}

// put stores job as it is.
func (f *fakeAdmin) put(job jobs.Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.jobs[job.ID] = job
}

// finish ends a job in state with report, releasing its projection's
// rebuild.
func (f *fakeAdmin) finish(id string, state jobs.JobState, report *projection.VerifyReport) {
	f.mu.Lock()
	defer f.mu.Unlock()
	job := f.jobs[id]
	job.State, job.FinishedAt, job.Report = state, job.CreatedAt.Add(time.Minute), report
	f.jobs[id] = job
	if f.rebuild[job.Projection] == id {
		delete(f.rebuild, job.Projection)
	}
}

func (f *fakeAdmin) StartRebuild(_ context.Context, projection string, partitions int) (jobs.Job, error) {
	defer f.call(adminCall{Method: "StartRebuild", Projection: projection, Partitions: partitions})()
	if !f.known[projection] {
		return jobs.Job{}, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	if partitions < 1 || partitions > jobs.MaxPartitions {
		// The handler validates; this is loud (a 500) if it stops doing so.
		return jobs.Job{}, fmt.Errorf("fake admin: partitions %d reached StartRebuild", partitions)
	}
	if id, ok := f.rebuild[projection]; ok {
		return jobs.Job{}, fmt.Errorf("rebuild %s: %w", id, domain.ErrJobRunning)
	}
	job := f.newJob(jobs.KindRebuild, projection)
	job.Partitions, job.Shadow = partitions, projection+"_"+job.ID
	f.jobs[job.ID], f.rebuild[projection] = job, job.ID
	return job, nil
}

func (f *fakeAdmin) StartVerify(_ context.Context, projection string, repair bool) (jobs.Job, error) {
	defer f.call(adminCall{Method: "StartVerify", Projection: projection, Repair: repair})()
	if !f.known[projection] {
		return jobs.Job{}, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	job := f.newJob(jobs.KindVerify, projection)
	job.Repair = repair
	f.jobs[job.ID] = job
	return job, nil
}

// SwitchBack swaps a status's active and previous collections.
func (f *fakeAdmin) SwitchBack(_ context.Context, projection string) (admin.ProjectionStatus, error) {
	defer f.call(adminCall{Method: "SwitchBack", Projection: projection})()
	if !f.known[projection] {
		return admin.ProjectionStatus{}, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	if id := f.rebuild[projection]; id != "" {
		return admin.ProjectionStatus{}, fmt.Errorf("rebuild %s: %w", id, domain.ErrJobRunning)
	}
	for i, st := range f.statuses {
		if st.Name != projection {
			continue
		}
		if st.PreviousCollection == "" {
			return admin.ProjectionStatus{}, fmt.Errorf("%s: %w", projection, domain.ErrNoPrevious)
		}
		st.ActiveCollection, st.PreviousCollection = st.PreviousCollection, st.ActiveCollection
		st.ActiveVersion, st.PreviousVersion = st.PreviousVersion, st.ActiveVersion
		st.Generation++
		f.statuses[i] = st
		return st, nil
	}
	return admin.ProjectionStatus{}, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
}

func (f *fakeAdmin) StartReplay(_ context.Context, spec jobs.ReplaySpec) (jobs.Job, error) {
	defer f.call(adminCall{Method: "StartReplay", Spec: spec})()
	if spec.StreamID != "" {
		if err := domain.ValidateID("stream_id", spec.StreamID); err != nil {
			return jobs.Job{}, err
		}
	}
	job := f.newJob(jobs.KindReplay, "")
	job.Replay = &spec
	f.jobs[job.ID] = job
	return job, nil
}

func (f *fakeAdmin) Job(_ context.Context, id string) (jobs.Job, error) {
	defer f.call(adminCall{Method: "Job", ID: id})()
	return f.job(id)
}

func (f *fakeAdmin) CancelJob(_ context.Context, id string) (jobs.Job, error) {
	defer f.call(adminCall{Method: "CancelJob", ID: id})()
	job, err := f.job(id)
	if err != nil {
		return job, err
	}
	if job.State.Final() {
		return job, fmt.Errorf("job %s is %s: %w", id, job.State, domain.ErrJobFinished)
	}
	job.CancelRequested = true
	f.jobs[id] = job
	return job, nil
}

func (f *fakeAdmin) Projections(context.Context) ([]admin.ProjectionStatus, error) {
	defer f.call(adminCall{Method: "Projections"})()
	if f.err != nil {
		return nil, f.err
	}
	return append([]admin.ProjectionStatus{}, f.statuses...), nil
}

func (f *fakeAdmin) Relay(context.Context) (outbox.RelayStatus, error) {
	return f.relay, nil
}

func (f *fakeAdmin) DeadLetters(_ context.Context, projection string, limit int64) ([]projector.DeadLetter, error) {
	defer f.call(adminCall{Method: "DeadLetters", Projection: projection, Limit: limit})()
	if projection != "" && !f.known[projection] {
		return nil, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	out := []projector.DeadLetter{}
	for _, d := range f.letters {
		if (projection == "" || d.Projection == projection) && int64(len(out)) < limit {
			out = append(out, d)
		}
	}
	return out, nil
}

func (f *fakeAdmin) RetryDeadLetter(_ context.Context, id string) error {
	defer f.call(adminCall{Method: "RetryDeadLetter", ID: id})()
	err, ok := f.dead[id]
	if !ok {
		return fmt.Errorf("dead letter %q: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("retry %s: %w", id, err)
	}
	return nil
}

func (f *fakeAdmin) ReadModels(_ context.Context, orderID string) ([]projection.ReadModelCheck, error) {
	defer f.call(adminCall{Method: "ReadModels", ID: orderID})()
	cs, ok := f.checks[orderID]
	if !ok {
		return nil, fmt.Errorf("order %s: %w", orderID, domain.ErrNotFound)
	}
	return cs, nil
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// adminEnv is a server with the fake admin side, logging to a buffer.
type adminEnv struct {
	*env
	admin *fakeAdmin
	log   *syncBuffer
}

// newAdminEnv builds a server with the fake admin and token ("" leaves
// the admin routes off), after mod changed its config.
func newAdminEnv(t testing.TB, token string, mod ...func(*orderhttp.Config)) *adminEnv {
	t.Helper()
	a, buf := newFakeAdmin(), &syncBuffer{}
	e := newEnv(t, append([]func(*orderhttp.Config){func(c *orderhttp.Config) {
		c.Admin, c.AdminToken = a, token
		c.Log = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}}, mod...)...)
	return &adminEnv{env: e, admin: a, log: buf}
}

// call sends an admin request with the right token. A body goes as
// application/json; header pairs are added (or override).
func (e *adminEnv) call(t testing.TB, method, path, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	h := map[string]string{"Authorization": "Bearer " + adminToken}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return e.do(t, req{Method: method, Path: path, Body: body, Header: h})
}

// adminRoute is one admin route with a path that names things the fake
// knows or not; it does not matter for the tests that use it.
type adminRoute struct{ Method, Path, Body string }

var adminRoutes = []adminRoute{
	{http.MethodGet, "/v1/admin/projections", ""},
	{http.MethodPost, "/v1/admin/projections/order_summaries/rebuilds", `{"partitions":2}`},
	{http.MethodPost, "/v1/admin/projections/order_summaries/rebuilds", ""},
	{http.MethodGet, "/v1/admin/projections/order_summaries/rebuilds/job-1", ""},
	{http.MethodPost, "/v1/admin/projections/order_summaries/rebuilds/job-1/cancel", ""},
	{http.MethodPost, "/v1/admin/projections/order_summaries/verifications", `{"repair":true}`},
	{http.MethodGet, "/v1/admin/projections/order_summaries/verifications/job-1", ""},
	{http.MethodPost, "/v1/admin/projections/order_summaries/verifications/job-1/cancel", ""},
	{http.MethodPost, "/v1/admin/replays", `{"stream_id":"abc"}`},
	{http.MethodGet, "/v1/admin/replays/job-1", ""},
	{http.MethodPost, "/v1/admin/replays/job-1/cancel", ""},
	{http.MethodGet, "/v1/admin/dead-letters", ""},
	{http.MethodGet, "/v1/admin/dead-letters?limit=5&projection=order_summaries", ""},
	{http.MethodPost, "/v1/admin/dead-letters/order_summaries:ev-1/retry", ""},
	{http.MethodGet, "/v1/admin/orders/o-1/read-models", ""},
	{http.MethodGet, "/v1/admin/log", ""},
	{http.MethodGet, "/v1/admin/log?type=OrderPlaced&stream_id=o-1&correlation_id=c-1&limit=5", ""},
	{http.MethodGet, "/v1/admin/log/commits/o-1:0000000001", ""},
	{http.MethodGet, "/v1/admin/log/tail", ""},
	{http.MethodGet, "/v1/admin/history", ""},
}

// decodeJob reads a job from a response body.
func decodeJob(t testing.TB, rec *httptest.ResponseRecorder) jobs.Job {
	t.Helper()
	wantJSON(t, rec)
	var job jobs.Job
	if err := json.Unmarshal(rec.Body.Bytes(), &job); err != nil {
		t.Fatalf("job body %q: %v", rec.Body, err)
	}
	return job
}

// wantNoCalls fails unless the fake saw no call.
func wantNoCalls(t testing.TB, a *fakeAdmin) {
	t.Helper()
	if c := a.recorded(); len(c) != 0 {
		t.Errorf("the admin side was called: %+v", c)
	}
}

// TestAdminRoutesOff: without a token the admin routes do not exist, even
// with an admin side configured, whatever Authorization a client sends
// (an empty bearer token included); without an admin side neither.
func TestAdminRoutesOff(t *testing.T) {
	e := newAdminEnv(t, "")
	noAdmin := newEnv(t, func(c *orderhttp.Config) { c.AdminToken = adminToken })
	for _, r := range adminRoutes {
		for _, auth := range []string{"", "Bearer ", "Bearer " + adminToken, "bearer x"} {
			t.Run(r.Method+" "+r.Path+" "+auth, func(t *testing.T) {
				h := map[string]string{}
				if auth != "" {
					h["Authorization"] = auth
				}
				rq := req{Method: r.Method, Path: r.Path, Body: r.Body, Header: h}
				rec := e.do(t, rq)
				wantProblem(t, rec, http.StatusNotFound, "/problems/route")
				if rec.Header().Get("WWW-Authenticate") != "" {
					t.Errorf("WWW-Authenticate = %q on a route that does not exist", rec.Header().Get("WWW-Authenticate"))
				}
				wantProblem(t, noAdmin.do(t, rq), http.StatusNotFound, "/problems/route")
			})
		}
	}
	wantNoCalls(t, e.admin)
}

// TestAdminAuth: only "Bearer <token>" (the scheme in any case) passes;
// everything else is a 401 problem with a WWW-Authenticate challenge that
// never reaches the admin side, on every route and on unknown admin paths.
func TestAdminAuth(t *testing.T) {
	sameLength := strings.Repeat("x", len(adminToken))
	tests := []struct {
		name string
		auth string // "" sends no Authorization
		ok   bool
	}{
		{name: "no header", auth: ""},
		{name: "basic scheme", auth: "Basic YWRtaW46" + adminToken},
		{name: "basic scheme with the token", auth: "Basic " + adminToken},
		{name: "wrong token, same length", auth: "Bearer " + sameLength},
		{name: "token one byte off", auth: "Bearer " + adminToken[:len(adminToken)-1] + "X"},
		{name: "shorter token", auth: "Bearer " + adminToken[:8]},
		{name: "token plus a byte", auth: "Bearer " + adminToken + "x"},
		{name: "token in other case", auth: "Bearer " + strings.ToUpper(adminToken)},
		{name: "empty token", auth: "Bearer "},
		{name: "scheme only", auth: "Bearer"},
		{name: "token without scheme", auth: adminToken},
		{name: "other scheme with the token", auth: "Token " + adminToken},
		{name: "right token", auth: "Bearer " + adminToken, ok: true},
		{name: "lowercase scheme", auth: "bearer " + adminToken, ok: true},
		{name: "uppercase scheme", auth: "BEARER " + adminToken, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range adminRoutes {
				e := newAdminEnv(t, adminToken)
				h := map[string]string{}
				if tt.auth != "" {
					h["Authorization"] = tt.auth
				}
				rec := e.do(t, req{Method: r.Method, Path: r.Path, Body: r.Body, Header: h})
				if tt.ok {
					if rec.Code == http.StatusUnauthorized {
						t.Errorf("%s %s: 401 with the right token: %s", r.Method, r.Path, rec.Body)
					}
					if len(e.admin.recorded()) == 0 {
						t.Errorf("%s %s: the admin side was not called: %d %s", r.Method, r.Path, rec.Code, rec.Body)
					}
					continue
				}
				wantProblem(t, rec, http.StatusUnauthorized, "/problems/unauthorized")
				if ch := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer ") {
					t.Errorf("%s %s: WWW-Authenticate = %q, want a Bearer challenge", r.Method, r.Path, ch)
				}
				wantNoCalls(t, e.admin)
			}
		})
	}

	// An unknown admin path, or a known one with another method, tells
	// nothing before authentication, and is a 404 after it.
	e := newAdminEnv(t, adminToken)
	for _, r := range []req{
		{Method: http.MethodGet, Path: "/v1/admin/nothing-here"},
		{Method: http.MethodGet, Path: "/v1/admin/replays"},
		{Method: http.MethodDelete, Path: "/v1/admin/projections"},
		{Method: http.MethodGet, Path: "/v1/admin/projections/order_summaries/rebuilds"},
	} {
		wantProblem(t, e.do(t, r), http.StatusUnauthorized, "/problems/unauthorized")
		r.Header = map[string]string{"Authorization": "Bearer " + adminToken}
		if rec := e.do(t, r); rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s with the token: %d, want 404 or 405; body %s", r.Method, r.Path, rec.Code, rec.Body)
		}
	}
	wantNoCalls(t, e.admin)
}

// TestAdminTokenNotLeaked: the token is in no response (body or header)
// and in no log line, whether the attempt failed or passed, and also when
// a request fails with a 500 that is logged.
func TestAdminTokenNotLeaked(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	e.admin.err = errors.New("status of projections: connection reset")
	var recs []*httptest.ResponseRecorder
	for _, auth := range []string{
		"Bearer " + adminToken + "x", "Basic " + adminToken, "Bearer " + adminToken[1:], adminToken,
		"Bearer " + adminToken, "bearer " + adminToken,
	} {
		for _, r := range adminRoutes {
			recs = append(recs, e.do(t, req{Method: r.Method, Path: r.Path, Body: r.Body,
				Header: map[string]string{"Authorization": auth, "X-Request-Id": "rid-1"}}))
		}
		recs = append(recs, e.do(t, req{Method: http.MethodGet, Path: "/v1/admin/nothing-here",
			Header: map[string]string{"Authorization": auth}}))
	}
	var got500 bool
	for _, rec := range recs {
		got500 = got500 || rec.Code == http.StatusInternalServerError
		if strings.Contains(rec.Body.String(), adminToken) {
			t.Errorf("the token is in a %d response body: %s", rec.Code, rec.Body)
		}
		for k, vs := range rec.Header() {
			for _, v := range vs {
				if strings.Contains(v, adminToken) {
					t.Errorf("the token is in the response header %s: %q", k, v)
				}
			}
		}
	}
	// The checks of the log are not vacuous: the failing Projections call
	// was answered with a 500 and logged.
	if !got500 || !strings.Contains(e.log.String(), "connection reset") {
		t.Fatalf("want a logged 500 from the failing Projections call; log:\n%s", e.log)
	}
	if strings.Contains(e.log.String(), adminToken) {
		t.Errorf("the token is in the log:\n%s", e.log)
	}
}

// TestAdminStartRebuild: the body is optional; partitions default to 1 and
// are 1 to 64; anything else is refused before the admin side is called.
func TestAdminStartRebuild(t *testing.T) {
	const path = "/v1/admin/projections/order_summaries/rebuilds"
	tests := []struct {
		name       string
		body       string
		header     []string
		status     int
		typ        string // problem type of a refusal
		field      string // a field the refusal names
		partitions int    // passed on success
	}{
		{name: "no body", status: 202, partitions: 1},
		{name: "empty object", body: `{}`, status: 202, partitions: 1},
		{name: "white space only", body: " \n", header: []string{"Content-Type", ""}, status: 202, partitions: 1},
		{name: "two", body: `{"partitions":2}`, status: 202, partitions: 2},
		{name: "the most", body: `{"partitions":64}`, status: 202, partitions: 64},
		{name: "json subtype", body: `{"partitions":3}`, header: []string{"Content-Type", "application/merge-patch+json"}, status: 202, partitions: 3},
		{name: "zero", body: `{"partitions":0}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "too many", body: `{"partitions":65}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "negative", body: `{"partitions":-1}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "huge", body: `{"partitions":99999999999999999999}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "string", body: `{"partitions":"2"}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "fraction", body: `{"partitions":2.5}`, status: 422, typ: "/problems/validation", field: "partitions"},
		{name: "unknown field", body: `{"parts":2}`, status: 400, typ: "/problems/malformed"},
		{name: "field in other case", body: `{"Partitions":2}`, status: 400, typ: "/problems/malformed"},
		{name: "field twice", body: `{"partitions":1,"partitions":65}`, status: 400, typ: "/problems/malformed"},
		{name: "trailing data", body: `{"partitions":2}{}`, status: 400, typ: "/problems/malformed"},
		{name: "array", body: `[2]`, status: 400, typ: "/problems/malformed"},
		{name: "not JSON", body: `partitions=2`, status: 400, typ: "/problems/malformed"},
		{name: "text content type", body: `{"partitions":2}`, header: []string{"Content-Type", "text/plain"}, status: 415, typ: "/problems/unsupported"},
		{name: "form content type", body: `partitions=2`, header: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415, typ: "/problems/unsupported"},
		{name: "no content type", body: `{"partitions":2}`, header: []string{"Content-Type", ""}, status: 415, typ: "/problems/unsupported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newAdminEnv(t, adminToken)
			rec := e.call(t, http.MethodPost, path, tt.body, tt.header...)
			if tt.status != http.StatusAccepted {
				wantProblem(t, rec, tt.status, tt.typ)
				if tt.field != "" {
					wantProblem(t, rec, tt.status, tt.typ, tt.field)
				}
				wantNoCalls(t, e.admin)
				return
			}
			if rec.Code != http.StatusAccepted {
				t.Fatalf("status = %d, want 202; body %s", rec.Code, rec.Body)
			}
			job := decodeJob(t, rec)
			if job.ID == "" || job.Kind != jobs.KindRebuild || job.Projection != "order_summaries" || job.Partitions != tt.partitions {
				t.Errorf("job = %+v, want a rebuild of order_summaries in %d partitions", job, tt.partitions)
			}
			if loc, want := rec.Header().Get("Location"), path+"/"+job.ID; loc != want {
				t.Errorf("Location = %q, want %q", loc, want)
			}
			calls := e.admin.recorded()
			if len(calls) != 1 || calls[0] != (adminCall{Method: "StartRebuild", Projection: "order_summaries", Partitions: tt.partitions}) {
				t.Errorf("calls = %+v, want one StartRebuild of order_summaries with %d partitions", calls, tt.partitions)
			}
		})
	}
}

// TestAdminRebuildConflicts: one unfinished rebuild per projection; an
// unknown projection is a 404.
func TestAdminRebuildConflicts(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	const path = "/v1/admin/projections/order_summaries/rebuilds"
	rec := e.call(t, http.MethodPost, path, "")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("first start: %d %s", rec.Code, rec.Body)
	}
	first := decodeJob(t, rec)

	rec = e.call(t, http.MethodPost, path, `{"partitions":4}`)
	wantProblem(t, rec, http.StatusConflict, "/problems/job-running")
	if rec.Header().Get("Location") != "" {
		t.Errorf("a refused start has Location %q", rec.Header().Get("Location"))
	}
	// Another projection is not blocked.
	if rec := e.call(t, http.MethodPost, "/v1/admin/projections/customer_order_stats/rebuilds", ""); rec.Code != http.StatusAccepted {
		t.Errorf("rebuild of another projection: %d %s", rec.Code, rec.Body)
	}
	// Once the first has finished, a new one starts.
	e.admin.finish(first.ID, jobs.StateSucceeded, nil)
	rec = e.call(t, http.MethodPost, path, `{"partitions":4}`)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("start after the first finished: %d %s", rec.Code, rec.Body)
	}
	if job := decodeJob(t, rec); job.ID == first.ID || job.Partitions != 4 {
		t.Errorf("second job = %+v, want a new one in 4 partitions", job)
	}
	if n := len(e.admin.callsOf("StartRebuild")); n != 4 {
		t.Errorf("StartRebuild calls = %d, want 4", n)
	}

	for _, name := range []string{"nope", "order_summaries_x", "%24where", "ORDER_SUMMARIES"} {
		rec := e.call(t, http.MethodPost, "/v1/admin/projections/"+name+"/rebuilds", "")
		wantProblem(t, rec, http.StatusNotFound, "/problems/not-found")
	}
}

// adminJobs puts jobs of every kind into the fake: a queued rebuild and a
// verify of order_summaries, a finished rebuild of it, a rebuild of
// customer_order_stats and a replay.
type adminJobs struct {
	rebuild, verify, done, otherRebuild, replay jobs.Job
}

func putAdminJobs(a *fakeAdmin) adminJobs {
	a.mu.Lock()
	j := adminJobs{
		rebuild:      a.newJob(jobs.KindRebuild, "order_summaries"),
		verify:       a.newJob(jobs.KindVerify, "order_summaries"),
		done:         a.newJob(jobs.KindRebuild, "order_summaries"),
		otherRebuild: a.newJob(jobs.KindRebuild, "customer_order_stats"),
		replay:       a.newJob(jobs.KindReplay, ""),
	}
	a.mu.Unlock()
	j.rebuild.Partitions = 3
	j.done.State, j.done.FinishedAt = jobs.StateSucceeded, j.done.CreatedAt.Add(time.Hour)
	j.replay.Replay = &jobs.ReplaySpec{StreamID: "o-1"}
	for _, job := range []jobs.Job{j.rebuild, j.verify, j.done, j.otherRebuild, j.replay} {
		a.put(job)
	}
	return j
}

// TestAdminGetJob: a job is found only under the route of its kind and
// projection.
func TestAdminGetJob(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	j := putAdminJobs(e.admin)
	const base = "/v1/admin/projections/order_summaries"
	tests := []struct {
		path string
		want *jobs.Job // nil: 404
	}{
		{path: base + "/rebuilds/" + j.rebuild.ID, want: &j.rebuild},
		{path: base + "/rebuilds/" + j.done.ID, want: &j.done},
		{path: base + "/verifications/" + j.verify.ID, want: &j.verify},
		{path: "/v1/admin/projections/customer_order_stats/rebuilds/" + j.otherRebuild.ID, want: &j.otherRebuild},
		{path: "/v1/admin/replays/" + j.replay.ID, want: &j.replay},

		{path: base + "/rebuilds/" + j.verify.ID},                                     // a verify under rebuilds
		{path: base + "/verifications/" + j.rebuild.ID},                               // a rebuild under verifications
		{path: base + "/rebuilds/" + j.replay.ID},                                     // a replay under rebuilds
		{path: base + "/rebuilds/" + j.otherRebuild.ID},                               // another projection's
		{path: "/v1/admin/projections/customer_order_stats/rebuilds/" + j.rebuild.ID}, // another projection's
		{path: "/v1/admin/projections/nope/rebuilds/" + j.rebuild.ID},                 // unknown projection
		{path: "/v1/admin/replays/" + j.rebuild.ID},                                   // a rebuild under replays
		{path: "/v1/admin/replays/" + j.verify.ID},                                    // a verify under replays
		{path: base + "/rebuilds/job-999"},                                            // unknown
		{path: base + "/rebuilds/a.b"},                                                // invalid
		{path: base + "/rebuilds/%24gt"},                                              // invalid
		{path: base + "/rebuilds/%00"},                                                // invalid
		{path: base + "/rebuilds/" + strings.Repeat("j", 5000)},                       // invalid
		{path: "/v1/admin/replays/%7B%7D"},                                            // invalid
	}
	for _, tt := range tests {
		rec := e.call(t, http.MethodGet, tt.path, "")
		if tt.want == nil {
			wantProblem(t, rec, http.StatusNotFound, "/problems/not-found")
			continue
		}
		if rec.Code != http.StatusOK {
			t.Errorf("GET %s: %d %s", tt.path, rec.Code, rec.Body)
			continue
		}
		got := decodeJob(t, rec)
		if got.ID != tt.want.ID || got.Kind != tt.want.Kind || got.Projection != tt.want.Projection ||
			got.State != tt.want.State || got.Partitions != tt.want.Partitions || !got.CreatedAt.Equal(tt.want.CreatedAt) {
			t.Errorf("GET %s = %+v, want %+v", tt.path, got, *tt.want)
		}
		if (tt.want.Replay == nil) != (got.Replay == nil) || got.Replay != nil && *got.Replay != *tt.want.Replay {
			t.Errorf("GET %s: replay spec %+v, want %+v", tt.path, got.Replay, tt.want.Replay)
		}
	}
	if n := len(e.admin.callsOf("CancelJob")); n != 0 {
		t.Errorf("a GET canceled %d jobs", n)
	}
}

// TestAdminCancelJob: a cancel is accepted for an unfinished job of the
// route's kind and projection, a 409 for a finished one, and a 404 (with
// nothing canceled) for a job of another kind or projection.
func TestAdminCancelJob(t *testing.T) {
	const base = "/v1/admin/projections/order_summaries"
	tests := []struct {
		name   string
		path   func(adminJobs) string
		status int
		typ    string
	}{
		{name: "rebuild", path: func(j adminJobs) string { return base + "/rebuilds/" + j.rebuild.ID + "/cancel" }, status: 202},
		{name: "verify", path: func(j adminJobs) string { return base + "/verifications/" + j.verify.ID + "/cancel" }, status: 202},
		{name: "replay", path: func(j adminJobs) string { return "/v1/admin/replays/" + j.replay.ID + "/cancel" }, status: 202},
		{name: "finished", path: func(j adminJobs) string { return base + "/rebuilds/" + j.done.ID + "/cancel" }, status: 409, typ: "/problems/job-finished"},
		{name: "verify under rebuilds", path: func(j adminJobs) string { return base + "/rebuilds/" + j.verify.ID + "/cancel" }, status: 404, typ: "/problems/not-found"},
		{name: "rebuild under replays", path: func(j adminJobs) string { return "/v1/admin/replays/" + j.rebuild.ID + "/cancel" }, status: 404, typ: "/problems/not-found"},
		{name: "replay under verifications", path: func(j adminJobs) string { return base + "/verifications/" + j.replay.ID + "/cancel" }, status: 404, typ: "/problems/not-found"},
		{name: "another projection's", path: func(j adminJobs) string { return base + "/rebuilds/" + j.otherRebuild.ID + "/cancel" }, status: 404, typ: "/problems/not-found"},
		{name: "unknown", path: func(adminJobs) string { return base + "/rebuilds/job-999/cancel" }, status: 404, typ: "/problems/not-found"},
		{name: "invalid", path: func(adminJobs) string { return base + "/rebuilds/a.b/cancel" }, status: 404, typ: "/problems/not-found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newAdminEnv(t, adminToken)
			j := putAdminJobs(e.admin)
			path := tt.path(j)
			rec := e.call(t, http.MethodPost, path, "")
			cancels := e.admin.callsOf("CancelJob")
			if tt.status != http.StatusAccepted {
				wantProblem(t, rec, tt.status, tt.typ)
				if tt.status == http.StatusNotFound && len(cancels) != 0 {
					t.Errorf("a 404 still canceled: %+v", cancels)
				}
				return
			}
			if rec.Code != http.StatusAccepted {
				t.Fatalf("POST %s: %d %s", path, rec.Code, rec.Body)
			}
			job := decodeJob(t, rec)
			if !job.CancelRequested || !strings.Contains(path, "/"+job.ID+"/") {
				t.Errorf("job = %+v, want the job of %s with cancel_requested", job, path)
			}
			if len(cancels) != 1 || cancels[0].ID != job.ID {
				t.Errorf("CancelJob calls = %+v, want one of %s", cancels, job.ID)
			}
		})
	}
}

// TestAdminVerify: repair is passed on; the report is readable once the
// job has finished.
func TestAdminVerify(t *testing.T) {
	const path = "/v1/admin/projections/order_summaries/verifications"
	for _, tt := range []struct {
		body   string
		repair bool
	}{{`{"repair":true}`, true}, {`{"repair":false}`, false}, {"", false}, {`{}`, false}} {
		e := newAdminEnv(t, adminToken)
		rec := e.call(t, http.MethodPost, path, tt.body)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("POST %s %s: %d %s", path, tt.body, rec.Code, rec.Body)
		}
		job := decodeJob(t, rec)
		if job.Kind != jobs.KindVerify || job.Projection != "order_summaries" || job.Repair != tt.repair {
			t.Errorf("body %s: job = %+v, want a verify of order_summaries with repair %v", tt.body, job, tt.repair)
		}
		if loc, want := rec.Header().Get("Location"), path+"/"+job.ID; loc != want {
			t.Errorf("Location = %q, want %q", loc, want)
		}
		calls := e.admin.recorded()
		if len(calls) != 1 || calls[0] != (adminCall{Method: "StartVerify", Projection: "order_summaries", Repair: tt.repair}) {
			t.Errorf("body %s: calls = %+v, want one StartVerify with repair %v", tt.body, calls, tt.repair)
		}

		if !tt.repair || tt.body == "" {
			continue
		}
		report := &projection.VerifyReport{Collection: "order_summaries", Streams: 10, Events: 42, Documents: 10,
			Missing: 1, Different: 2, Repaired: 3, Examples: []projection.DriftExample{{ID: "o-7", Kind: "different", StoredVersion: 3, LogVersion: 4, Fields: []string{"status"}}},
			Digest: "ab12", ExpectedDigest: "cd34"}
		e.admin.finish(job.ID, jobs.StateSucceeded, report)
		rec = e.call(t, http.MethodGet, location(rec), "")
		if rec.Code != http.StatusOK {
			t.Fatalf("GET the verify: %d %s", rec.Code, rec.Body)
		}
		got := decodeJob(t, rec)
		if got.ID != job.ID || got.State != jobs.StateSucceeded || got.Report == nil {
			t.Fatalf("GET the verify = %s, want it succeeded with a report", rec.Body)
		}
		gotReport, _ := json.Marshal(got.Report)
		wantReport, _ := json.Marshal(report)
		if !bytes.Equal(gotReport, wantReport) {
			t.Errorf("report = %s, want %s", gotReport, wantReport)
		}
	}

	for _, tt := range []struct{ body, typ string }{
		{`{"repair":"yes"}`, "/problems/validation"},
		{`{"repair":1}`, "/problems/validation"},
		{`{"repair":true,"dry_run":true}`, "/problems/malformed"},
	} {
		e := newAdminEnv(t, adminToken)
		wantProblem(t, e.call(t, http.MethodPost, path, tt.body), map[string]int{"/problems/validation": 422, "/problems/malformed": 400}[tt.typ], tt.typ)
		wantNoCalls(t, e.admin)
	}
	e := newAdminEnv(t, adminToken)
	wantProblem(t, e.call(t, http.MethodPost, "/v1/admin/projections/nope/verifications", `{"repair":true}`), http.StatusNotFound, "/problems/not-found")
}

// location is the Location header of rec.
func location(rec *httptest.ResponseRecorder) string { return rec.Header().Get("Location") }

// TestAdminReplay: a stream or a time range is passed on; an invalid
// stream id or time, or a body of another shape, is refused before the
// admin side is called.
func TestAdminReplay(t *testing.T) {
	from, to := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		body string
		spec jobs.ReplaySpec
	}{
		{`{"stream_id":"abc"}`, jobs.ReplaySpec{StreamID: "abc"}},
		{`{"from":"2025-01-01T00:00:00Z","to":"2025-01-02T03:04:05Z"}`, jobs.ReplaySpec{From: from, To: to}},
		{`{"from":"2025-01-01T01:00:00+01:00"}`, jobs.ReplaySpec{From: from}},
	} {
		e := newAdminEnv(t, adminToken)
		rec := e.call(t, http.MethodPost, "/v1/admin/replays", tt.body)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("POST %s: %d %s", tt.body, rec.Code, rec.Body)
		}
		job := decodeJob(t, rec)
		if loc, want := location(rec), "/v1/admin/replays/"+job.ID; loc != want || job.Kind != jobs.KindReplay {
			t.Errorf("POST %s: Location %q, job %+v; want %q and a replay", tt.body, loc, job, want)
		}
		calls := e.admin.callsOf("StartReplay")
		if len(calls) != 1 || calls[0].Spec.StreamID != tt.spec.StreamID || !calls[0].Spec.From.Equal(tt.spec.From) || !calls[0].Spec.To.Equal(tt.spec.To) {
			t.Errorf("POST %s: calls %+v, want one StartReplay of %+v", tt.body, calls, tt.spec)
		}

		rec = e.call(t, http.MethodGet, "/v1/admin/replays/"+job.ID, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("GET the replay: %d %s", rec.Code, rec.Body)
		}
		if got := decodeJob(t, rec); got.ID != job.ID || got.Replay == nil || got.Replay.StreamID != tt.spec.StreamID || !got.Replay.From.Equal(tt.spec.From) {
			t.Errorf("GET the replay = %s, want job %s of %+v", rec.Body, job.ID, tt.spec)
		}
	}

	for _, tt := range []struct {
		body, header string // header: Content-Type, "-" for the default
		status       int
		typ, field   string
	}{
		{body: `{"stream_id":"a.b"}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"stream_id":"a b"}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"stream_id":"` + strings.Repeat("s", 5000) + `"}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"stream_id":{"$gt":""}}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"stream_id":["abc"]}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"stream_id":7}`, status: 422, typ: "/problems/validation", field: "stream_id"},
		{body: `{"from":"yesterday"}`, status: 422, typ: "/problems/validation", field: "from"},
		{body: `{"to":"2025-13-01T00:00:00Z"}`, status: 422, typ: "/problems/validation", field: "to"},
		{body: `{"from":1735689600}`, status: 422, typ: "/problems/validation", field: "from"},
		{body: `{"stream":"abc"}`, status: 400, typ: "/problems/malformed"},
		{body: `{"$where":"1"}`, status: 400, typ: "/problems/malformed"},
		{body: ``, status: 400, typ: "/problems/malformed"},
		{body: `null`, status: 400, typ: "/problems/malformed"},
		{body: `{"stream_id":"abc"}`, header: "text/plain", status: 415, typ: "/problems/unsupported"},
	} {
		e := newAdminEnv(t, adminToken)
		var h []string
		if tt.header != "" {
			h = []string{"Content-Type", tt.header}
		}
		rec := e.call(t, http.MethodPost, "/v1/admin/replays", tt.body, h...)
		if tt.field != "" {
			wantProblem(t, rec, tt.status, tt.typ, tt.field)
		} else {
			wantProblem(t, rec, tt.status, tt.typ)
		}
		wantNoCalls(t, e.admin)
	}
}

// TestAdminProjections: the projections' states under "projections",
// the relay's under "relay".
func TestAdminProjections(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	lag := uint64(17)
	e.admin.statuses[0].ConsumerLag = &lag
	e.admin.statuses[0].DeadLetters = 2
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	e.admin.relay = outbox.RelayStatus{Owner: "relay-1", Epoch: 3, LeaseUntil: at.Add(10 * time.Second),
		CheckpointRecordedAt: at.Add(-time.Second), CheckpointSavedAt: at}
	rec := e.call(t, http.MethodGet, "/v1/admin/projections", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/admin/projections: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	var body struct {
		Projections []admin.ProjectionStatus `json:"projections"`
		Relay       outbox.RelayStatus       `json:"relay"`
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	ps := body.Projections
	if len(ps) != 2 {
		t.Fatalf("body = %s, want {\"projections\": [two], \"relay\": ...}", rec.Body)
	}
	if body.Relay != e.admin.relay {
		t.Errorf("relay = %+v, want %+v", body.Relay, e.admin.relay)
	}
	if ps[0].Name != "order_summaries" || ps[0].ConsumerLag == nil || *ps[0].ConsumerLag != 17 || ps[0].DeadLetters != 2 ||
		ps[1].Name != "customer_order_stats" || ps[1].ConsumerLag != nil {
		t.Errorf("projections = %s", rec.Body)
	}
}

// TestAdminSwitchBack: the state after the switch is answered; nothing to
// switch back to, a rebuild running, an unknown projection and a body are
// refused with their problem types.
func TestAdminSwitchBack(t *testing.T) {
	const path = "/v1/admin/projections/order_summaries/switch-back"
	e := newAdminEnv(t, adminToken)
	rec := e.call(t, http.MethodPost, path, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, rec.Code, rec.Body)
	}
	var st admin.ProjectionStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if st.ActiveCollection != "order_summaries" || st.ActiveVersion != 1 || st.PreviousCollection != "order_summaries_v2_0193" || st.PreviousVersion != 2 {
		t.Errorf("after the switch back = %s, want order_summaries v1 active and the v2 collection previous", rec.Body)
	}
	if calls := e.admin.callsOf("SwitchBack"); len(calls) != 1 || calls[0].Projection != "order_summaries" {
		t.Errorf("calls = %+v, want one SwitchBack of order_summaries", calls)
	}
	wantProblem(t, e.call(t, http.MethodPost, "/v1/admin/projections/customer_order_stats/switch-back", ""), http.StatusConflict, "/problems/no-previous")
	wantProblem(t, e.call(t, http.MethodPost, "/v1/admin/projections/nope/switch-back", ""), http.StatusNotFound, "/problems/not-found")

	e = newAdminEnv(t, adminToken)
	e.admin.rebuild["order_summaries"] = "job-9"
	wantProblem(t, e.call(t, http.MethodPost, path, "{}"), http.StatusConflict, "/problems/job-running")
	e = newAdminEnv(t, adminToken)
	wantProblem(t, e.call(t, http.MethodPost, path, `{"to":"v1"}`), http.StatusBadRequest, "/problems/malformed")
	wantNoCalls(t, e.admin)
}

// TestAdminDeadLetters: limit is 1 to 1000 (100 by default) and checked
// before the admin side is called; projection is passed on.
func TestAdminDeadLetters(t *testing.T) {
	for _, q := range []string{"limit=0", "limit=-1", "limit=1001", "limit=abc", "limit=5.5", "limit=1e2", "limit=%20", "limit=99999999999999999999"} {
		e := newAdminEnv(t, adminToken)
		wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/dead-letters?"+q, ""), http.StatusUnprocessableEntity, "/problems/validation", "limit")
		wantNoCalls(t, e.admin)
	}

	for _, tt := range []struct {
		query      string
		projection string
		limit      int64
		n          int
	}{
		{query: "", limit: 100, n: 8},
		{query: "?limit=5", limit: 5, n: 5},
		{query: "?limit=1", limit: 1, n: 1},
		{query: "?limit=1000", limit: 1000, n: 8},
		{query: "?projection=customer_order_stats&limit=5", projection: "customer_order_stats", limit: 5, n: 2},
	} {
		e := newAdminEnv(t, adminToken)
		for i := range 8 {
			p := "order_summaries"
			if i%4 == 0 {
				p = "customer_order_stats"
			}
			e.admin.letters = append(e.admin.letters, projector.DeadLetter{ID: fmt.Sprintf("%s:ev-%d", p, i), Projection: p, StreamID: "o-1"})
		}
		rec := e.call(t, http.MethodGet, "/v1/admin/dead-letters"+tt.query, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", tt.query, rec.Code, rec.Body)
		}
		wantJSON(t, rec)
		var body map[string][]projector.DeadLetter
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
		if ds, ok := body["dead_letters"]; !ok || len(ds) != tt.n {
			t.Errorf("GET %s = %s, want %d dead letters", tt.query, rec.Body, tt.n)
		}
		calls := e.admin.recorded()
		if len(calls) != 1 || calls[0] != (adminCall{Method: "DeadLetters", Projection: tt.projection, Limit: tt.limit}) {
			t.Errorf("GET %s: calls %+v, want DeadLetters(%q, %d)", tt.query, calls, tt.projection, tt.limit)
		}
	}

	e := newAdminEnv(t, adminToken)
	wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/dead-letters?projection=nope", ""), http.StatusNotFound, "/problems/not-found")
}

// TestAdminRetryDeadLetter: applied is a 200; a dead letter that still
// fails is a 409; an unknown one a 404.
func TestAdminRetryDeadLetter(t *testing.T) {
	tests := []struct {
		id     string
		status int
		typ    string
	}{
		{id: "order_summaries:ev-1", status: 200},
		{id: "order_summaries:ev-2", status: 409, typ: "/problems/retry-failed"},
		{id: "order_summaries:ev-3", status: 404, typ: "/problems/not-found"},
		{id: "nope", status: 404, typ: "/problems/not-found"},
	}
	for _, tt := range tests {
		e := newAdminEnv(t, adminToken)
		e.admin.dead["order_summaries:ev-1"] = nil
		e.admin.dead["order_summaries:ev-2"] = errors.Join(fmt.Errorf("apply: %w", domain.ErrRetryFailed), errors.New("decode: bad payload"))
		rec := e.call(t, http.MethodPost, "/v1/admin/dead-letters/"+tt.id+"/retry", "")
		calls := e.admin.recorded()
		if len(calls) != 1 || calls[0] != (adminCall{Method: "RetryDeadLetter", ID: tt.id}) {
			t.Errorf("retry %s: calls %+v", tt.id, calls)
		}
		if tt.status != http.StatusOK {
			wantProblem(t, rec, tt.status, tt.typ)
			continue
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("retry %s: %d %s", tt.id, rec.Code, rec.Body)
		}
		wantJSON(t, rec)
		var body map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body["id"] != tt.id || body["result"] != "applied" {
			t.Errorf("retry %s: body %s, want its id and result applied", tt.id, rec.Body)
		}
	}
}

// TestAdminNo5xx: no request a client can make to the admin routes, with
// or without the token, is answered with a 5xx when the admin side works.
func TestAdminNo5xx(t *testing.T) {
	bodies := []string{
		"", "{}", "null", "[]", `"x"`, "0", "{", `{"partitions":`, `{"partitions":null}`, `{"repair":null}`,
		`{"stream_id":null}`, `{"partitions":1e400}`, `{"partitions":-9223372036854775809}`,
		`{"to":"2025-01-01T00:00:00Z","from":"2026-01-01T00:00:00Z"}`, `{"stream_id":"abc","from":"2025-01-01T00:00:00Z"}`,
		"\xff\xfe{}", `{"stream_id":"\u0000"}`, `{"stream_id":"\ud800"}`,
	}
	paths := []string{
		"/v1/admin/projections", "/v1/admin/projections/order_summaries/rebuilds",
		"/v1/admin/projections/order_summaries/verifications", "/v1/admin/replays",
		"/v1/admin/projections/%2e%2e/rebuilds", "/v1/admin/projections/order_summaries/rebuilds/..%2f..%2fjob",
		"/v1/admin/projections/order_summaries/rebuilds/job-1/cancel", "/v1/admin/replays/job-1",
		"/v1/admin/dead-letters?limit=" + strings.Repeat("9", 400), "/v1/admin/dead-letters?limit=5&limit=0&projection=%00",
		"/v1/admin/dead-letters/%ff/retry", "/v1/admin/dead-letters/" + strings.Repeat("d", 10000) + "/retry",
		"/v1/admin/projections/" + strings.Repeat("p", 10000) + "/verifications",
	}
	e := newAdminEnv(t, adminToken)
	putAdminJobs(e.admin)
	check := func(r req) {
		t.Helper()
		if rec := e.do(t, r); rec.Code >= 500 {
			t.Errorf("%s %.80s body %.40q: %d %s", r.Method, r.Path, r.Body, rec.Code, rec.Body)
		}
	}
	bearer := map[string]string{"Authorization": "Bearer " + adminToken}
	for _, p := range paths {
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions, http.MethodHead} {
			for _, b := range bodies {
				check(req{Method: m, Path: p, Body: b, Header: bearer})
			}
			check(req{Method: m, Path: p})
			check(req{Method: m, Path: p, Header: map[string]string{"Authorization": "Bearer " + strings.Repeat("t", 100000)}})
		}
	}
	// Large and deep bodies, on the routes that read one.
	for _, b := range []string{
		`{"partitions":2}` + strings.Repeat(" ", 2<<20), strings.Repeat("[", 100000),
		`{"a":` + strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5001),
		`{"from":"` + strings.Repeat("9", 100000) + `"}`,
	} {
		for _, p := range paths[1:4] {
			check(req{Method: http.MethodPost, Path: p, Body: b, Header: bearer})
		}
	}
	if len(e.admin.recorded()) == 0 {
		t.Error("no request reached the admin side: the sweep tested nothing past the middleware")
	}
}

// TestAdminReadModels: an order's documents beside the fold are passed on
// as the admin side gives them; an unknown order is a 404, and an id that
// cannot exist is one before the admin side is called.
func TestAdminReadModels(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	want := []projection.ReadModelCheck{
		{Projection: "order_summaries", Collection: "order_summaries", State: "different", StoredVersion: 2, LogVersion: 2,
			Document: json.RawMessage(`{"status":"shipped","version":2}`), Expected: json.RawMessage(`{"status":"approved","version":2}`),
			Fields: []string{"status"}},
		{Projection: "customer_order_stats", Collection: "customer_order_stats", State: "missing", LogVersion: 2,
			Document: json.RawMessage("null"), Expected: json.RawMessage(`{"order_id":"o-1","version":2}`)},
	}
	e.admin.checks = map[string][]projection.ReadModelCheck{"o-1": want}
	rec := e.call(t, http.MethodGet, "/v1/admin/orders/o-1/read-models", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET read models: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	var body struct {
		OrderID    string                      `json:"order_id"`
		ReadModels []projection.ReadModelCheck `json:"read_models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if body.OrderID != "o-1" || len(body.ReadModels) != 2 || body.ReadModels[0].State != "different" ||
		!slices.Equal(body.ReadModels[0].Fields, []string{"status"}) || string(body.ReadModels[1].Document) != "null" ||
		string(body.ReadModels[0].Document) != string(want[0].Document) {
		t.Errorf("body = %s", rec.Body)
	}
	if calls := e.admin.recorded(); len(calls) != 1 || calls[0] != (adminCall{Method: "ReadModels", ID: "o-1"}) {
		t.Errorf("calls %+v", calls)
	}

	wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/orders/o-2/read-models", ""), http.StatusNotFound, "/problems/not-found")
	e = newAdminEnv(t, adminToken)
	for _, id := range []string{"%20x", strings.Repeat("o", 300), "a%2Fb"} {
		wantProblem(t, e.call(t, http.MethodGet, "/v1/admin/orders/"+id+"/read-models", ""), http.StatusNotFound, "/problems/not-found")
	}
	wantNoCalls(t, e.admin)
}
