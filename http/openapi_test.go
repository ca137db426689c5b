package http_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// openAPIMethods are the operations a path item may have, lower case as
// OpenAPI spells them.
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// newOpenAPIEnv builds a server with every optional route on: metrics
// (a gatherer) and the admin routes (an Admin and a token).
func newOpenAPIEnv(t testing.TB) *env {
	t.Helper()
	return newEnv(t, func(c *orderhttp.Config) { c.Admin, c.AdminToken = newFakeAdmin(), adminToken })
}

// openAPIDoc fetches GET /openapi.json and returns it raw and parsed.
func openAPIDoc(t testing.TB, e *env) ([]byte, map[string]any) {
	t.Helper()
	rec := e.get(t, "/openapi.json")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /openapi.json: %d %s", rec.Code, rec.Body)
	}
	wantJSON(t, rec)
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("GET /openapi.json: not JSON: %v", err)
	}
	return rec.Body.Bytes(), doc
}

// TestOpenAPISecurity checks that exactly the admin operations need the
// bearer token, and answer 401.
func TestOpenAPISecurity(t *testing.T) {
	_, doc := openAPIDoc(t, newOpenAPIEnv(t))
	for _, p := range checkSecurity(doc) {
		t.Error(p)
	}
}

// TestOpenAPIServedAlways checks that the document is served as
// application/json, with or without the admin routes.
func TestOpenAPIServedAlways(t *testing.T) {
	e := newOpenAPIEnv(t)
	rec := e.get(t, "/openapi.json")
	if mt, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type")); mt != "application/json" {
		t.Errorf("Content-Type = %q", rec.Header().Get("Content-Type"))
	}
	// Without ADMIN_TOKEN the server serves the same document: it says
	// the admin routes exist only with the token.
	off := newEnv(t)
	if got := off.get(t, "/openapi.json"); got.Code != http.StatusOK || !bytes.Equal(got.Body.Bytes(), rec.Body.Bytes()) {
		t.Errorf("without admin routes: %d, same document %v", got.Code, bytes.Equal(got.Body.Bytes(), rec.Body.Bytes()))
	}
}

// TestOpenAPIBodyLimitOnEveryRoute checks the one 4xx every operation
// documents, also those that take no body: the body limit is the server's
// (NewServer), so a declared Content-Length over it is refused with 413
// before the handler runs, and before the admin token check.
func TestOpenAPIBodyLimitOnEveryRoute(t *testing.T) {
	e := newOpenAPIEnv(t)
	_, doc := openAPIDoc(t, e)
	paths := doc["paths"].(map[string]any)
	big := strings.Repeat(" ", 1<<20+1)
	for _, route := range documentedRoutes(doc) {
		method, path, _ := strings.Cut(route, " ")
		op := paths[path].(map[string]any)[strings.ToLower(method)].(map[string]any)
		if _, ok := op["responses"].(map[string]any)["413"]; !ok {
			t.Errorf("%s: no 413 response", route)
		}
		target := templateParam.ReplaceAllString(path, "x")
		rec := e.do(t, req{Method: method, Path: target, Body: big})
		wantProblem(t, rec, http.StatusRequestEntityTooLarge, tooLarge)
	}
}

// TestProblemTypesDocumented: docs/api.md's table of problem types lists
// each type the document's Problem schema names, with the status its
// description gives, and no other.
func TestProblemTypesDocumented(t *testing.T) {
	_, doc := openAPIDoc(t, newOpenAPIEnv(t))
	typ := componentSchema(doc, "Problem")["properties"].(map[string]any)["type"].(map[string]any)
	var want []string
	for _, v := range typ["enum"].([]any) {
		want = append(want, v.(string))
	}
	md, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(/problems/[a-z-]+)` \\| ([0-9]{3}) \\|")
	var got []string
	for _, m := range row.FindAllStringSubmatch(string(md), -1) {
		got = append(got, m[1])
		slug := strings.TrimPrefix(m[1], "/problems/")
		// The description lists the types by status: "... and slug 409, ...".
		desc := typ["description"].(string)
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(slug) + `\b[^0-9]*\b` + m[2] + `\b`).MatchString(desc) {
			t.Errorf("docs/api.md gives %s status %s; the document's description of the types does not", m[1], m[2])
		}
	}
	if miss := missing(want, got); len(miss) > 0 {
		t.Errorf("docs/api.md's table lacks %v", miss)
	}
	if extra := missing(got, want); len(extra) > 0 {
		t.Errorf("docs/api.md's table lists %v, which the document does not", extra)
	}
}

// documentedRoutes returns the document's operations as "METHOD /path",
// sorted.
func documentedRoutes(doc map[string]any) []string {
	var out []string
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		item, _ := item.(map[string]any)
		for _, m := range openAPIMethods {
			if _, ok := item[m]; ok {
				out = append(out, strings.ToUpper(m)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// missing returns the entries of want not in have.
func missing(want, have []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(have, w) {
			out = append(out, w)
		}
	}
	return out
}

var templateParam = regexp.MustCompile(`\{[^}]*\}`)

// pointerUnescaper undoes JSON pointer (RFC 6901) escaping of a reference
// token.
var pointerUnescaper = strings.NewReplacer("~1", "/", "~0", "~")

// resolve follows a local reference, "#/a/b~1c".
func resolve(doc map[string]any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("not a local reference")
	}
	var cur any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = pointerUnescaper.Replace(tok)
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%q: not an object", tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("no %q", tok)
		}
	}
	return cur, nil
}

// deref returns v, or what it refers to when it is a {"$ref": ...}.
func deref(doc map[string]any, v any) map[string]any {
	m, _ := v.(map[string]any)
	if r, ok := m["$ref"].(string); ok {
		x, _ := resolve(doc, r)
		m, _ = x.(map[string]any)
	}
	return m
}

// checkSecurity checks that exactly the admin operations need the bearer
// token and that every scheme they name is defined.
func checkSecurity(doc map[string]any) []string {
	var out []string
	comps, _ := doc["components"].(map[string]any)
	schemes, _ := comps["securitySchemes"].(map[string]any)
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		item, _ := item.(map[string]any)
		for _, m := range openAPIMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			route := strings.ToUpper(m) + " " + path
			reqs, _ := op["security"].([]any)
			if admin := strings.HasPrefix(path, "/v1/admin/"); admin != (len(reqs) > 0) {
				out = append(out, fmt.Sprintf("%s: security %v", route, reqs))
			}
			for _, r := range reqs {
				r, _ := r.(map[string]any)
				for name := range r {
					if _, ok := schemes[name]; !ok {
						out = append(out, fmt.Sprintf("%s: no security scheme %q", route, name))
					}
				}
			}
			if _, ok := op["responses"].(map[string]any)["401"]; strings.HasPrefix(path, "/v1/admin/") && !ok {
				out = append(out, route+": no 401 response")
			}
		}
	}
	return out
}

// schemaProps returns a component schema's property names and required
// names.
func schemaProps(t testing.TB, schema map[string]any) (props, required []string) {
	t.Helper()
	if schema == nil {
		t.Fatal("no schema")
	}
	ps, _ := schema["properties"].(map[string]any)
	for p := range ps {
		props = append(props, p)
	}
	rs, _ := schema["required"].([]any)
	for _, r := range rs {
		required = append(required, r.(string))
	}
	sort.Strings(props)
	sort.Strings(required)
	return props, required
}

func componentSchema(doc map[string]any, name string) map[string]any {
	return deref(doc, map[string]any{"$ref": "#/components/schemas/" + name})
}

// jsonKeys returns the top-level keys of v's JSON form, sorted.
func jsonKeys(t testing.TB, v any) []string {
	t.Helper()
	b, ok := v.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestOpenAPISchemasMatchGoTypes checks the schemas of the Go types the
// API writes: the properties are the JSON fields of a value with every
// field set, and the required ones those of the zero value (the fields
// without omitempty or omitzero).
func TestOpenAPISchemasMatchGoTypes(t *testing.T) {
	e := newOpenAPIEnv(t)
	_, doc := openAPIDoc(t, e)

	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	lag := uint64(3)
	spec := jobs.ReplaySpec{StreamID: "s", From: at, To: at.Add(time.Hour)}
	resume := jobs.Resume{At: at, Owner: "o", Cursor: "c", Events: 1, Streams: 1}
	task := jobs.Task{ID: "j/part-0", Job: "j", Name: "part-0", From: "a", To: "b", State: "running", Owner: "o", Epoch: 1,
		LeaseUntil: at, Attempts: 1, Cursor: "a1", Events: 1, Streams: 1, Commits: 1, Poison: 1, Resumes: []jobs.Resume{resume},
		StartedAt: at, FinishedAt: at, Error: "e"}
	drift := projection.DriftExample{ID: "o-1", Kind: "different", StoredVersion: 1, LogVersion: 2, Fields: []string{"status"}}
	report := projection.VerifyReport{Collection: "c", Streams: 1, Events: 1, Documents: 1, Missing: 1, Stale: 1, Extra: 1, Different: 1,
		Repaired: 1, PoisonStreams: 1, Examples: []projection.DriftExample{drift}, Digest: "d", ExpectedDigest: "d"}
	job := jobs.Job{ID: "j", Kind: jobs.KindRebuild, Projection: "p", Version: 2, State: jobs.StateRunning, CreatedAt: at, FinishedAt: at,
		Error: "e", Partitions: 2, Shadow: "s", Repair: true, Replay: &spec, TotalCommits: 1, Bounds: []string{"m"}, Report: &report,
		StartedAt: at, Events: 1, Streams: 1, PoisonStreams: 1, RatePerSecond: 1, ETASeconds: 1, CancelRequested: true, Tasks: []jobs.Task{task}}
	pct := 49
	job.JobPhase = jobs.JobPhase{Phase: "scanning", Step: 1, Steps: 3, Percent: &pct, PhaseETASeconds: 1, EventsDone: 1, EventsTotal: 2}
	verifySummary := jobs.VerifySummary{Job: "j", State: jobs.StateSucceeded, FinishedAt: at, Drift: 1, Repaired: 1, Digest: "d"}
	jobSummary := job.Summary()
	behind := 1.5
	partition := projector.PartitionStatus{Partition: 1, Consumer: "proj_p_p01", Owner: "o", PinnedAt: at, Lag: &lag, LagSeconds: &behind, Applied: 1, ApplyRate: 1}
	projStatus := admin.ProjectionStatus{ProjectionStatus: jobs.ProjectionStatus{Name: "p", Version: 2, ActiveCollection: "a", ActiveVersion: 1, ShadowCollection: "s", ShadowVersion: 2,
		PreviousCollection: "b", PreviousVersion: 1, SwitchedBackFrom: 3, SwitchedAt: at, Generation: 1, ConsumerLag: &lag,
		ConsumerLagVersion: 2, ActiveLag: &lag, ShadowLag: &lag, LastError: "e", DeadLetters: 1, LastVerify: &verifySummary, LastRebuild: &jobSummary},
		Partitions: []projector.PartitionStatus{partition}, AckFloor: &lag}
	check := projection.ReadModelCheck{Projection: "p", Collection: "c", State: "different", StoredVersion: 1, LogVersion: 1,
		Document: json.RawMessage(`{"version":1}`), Expected: json.RawMessage(`{"version":1}`), Fields: []string{"status"}, FoldError: "e"}
	dead := projector.DeadLetter{ID: "p:1", Projection: "p", StreamID: "s", EventID: "e", Version: 1, Subject: "x", Payload: "{}",
		Error: "e", Deliveries: 1, ParkedAt: at, StreamSeq: 1, RetriedAt: at, RetryResult: "r"}
	line := domain.Line{SKU: "s", Quantity: 1, UnitPriceCents: 1, FreightCents: 1}
	order := domain.Order{ID: "o", CustomerID: "c", Status: domain.StatusCanceled, Currency: "BRL", Items: []domain.Line{line},
		ItemCount: 1, SubtotalCents: 1, FreightCents: 1, TotalCents: 2, PlacedAt: &at, ApprovedAt: &at, InvoicedAt: &at,
		ProcessingAt: &at, ShippedAt: &at, DeliveredAt: &at, CanceledAt: &at, UnavailableAt: &at, Reason: "r", Version: 9, UpdatedAt: at, RecordedAt: at}
	stats := domain.CustomerOrderStats{CustomerID: "c", OrderCount: 1, ByStatus: map[domain.Status]int64{domain.StatusCreated: 1},
		LifetimeValueCents: map[string]int64{"BRL": 1}, RecordedAt: at}
	sales := orderhttp.DailySalesReport{From: "2017-10-01", To: "2017-10-31", Days: []domain.DailySales{{Day: "2017-10-02", Currency: "BRL",
		OrdersPlaced: 2, Items: 3, GrossCents: 1, FreightCents: 1, OrdersCanceled: 1, OrdersUnavailable: 1}}}
	meta := domain.Metadata{CorrelationID: "c", CausationID: "c", SchemaVersion: 1}
	event, err := domain.MarshalEvent(domain.Event{ID: "e", StreamID: "o", StreamType: domain.StreamTypeOrder, Type: domain.TypeOrderCanceled,
		Version: 2, OccurredAt: at, RecordedAt: at, Data: domain.OrderCanceled{Reason: "r"}, Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	logCommit := domain.LogCommit{ID: "o:0000000002", StreamID: "o", StreamType: domain.StreamTypeOrder, FirstVersion: 2, LastVersion: 2,
		RecordedAt: at, Events: []domain.Event{{ID: "e", StreamID: "o", StreamType: domain.StreamTypeOrder, Type: domain.TypeOrderCanceled,
			Version: 2, OccurredAt: at, RecordedAt: at, Data: domain.OrderCanceled{Reason: "r"}, Metadata: meta}}, Error: "e"}
	logPage := domain.LogPage{Commits: []domain.LogCommit{logCommit}, Next: "n", DeadlineReached: true}
	age, rate := 1.5, 2.0
	projSample := admin.ProjectionSample{Name: "p", Lag: &lag, LagSeconds: &age, ApplyRate: &rate, LastError: "e"}
	relaySample := admin.RelaySample{Owner: "o", CheckpointAgeSeconds: &age, Catchups: &rate}
	sample := admin.HistorySample{At: at, Projections: []admin.ProjectionSample{projSample}, Relay: relaySample}
	history := admin.History{IntervalSeconds: 5, WindowSeconds: 3600, Samples: []admin.HistorySample{sample}}
	problem := orderhttp.Problem{Type: "/problems/validation", Title: "t", Status: 422, Detail: "d",
		Errors: []domain.FieldError{{Field: "f", Detail: "d"}}}

	for _, c := range []struct {
		schema     string
		full, zero any
	}{
		{"Order", order, domain.Order{}},
		{"Line", line, domain.Line{}},
		{"Event", event, event}, // every envelope field is always written
		{"EventMetadata", meta, domain.Metadata{}},
		{"OrderPlacedData", domain.OrderPlaced{CustomerID: "c", Currency: "BRL", Items: []domain.Line{line}, FreightCents: 1}, domain.OrderPlaced{}},
		{"ReasonData", domain.OrderCanceled{Reason: "r"}, domain.OrderCanceled{}},
		{"ReasonData", domain.OrderMarkedUnavailable{Reason: "r"}, domain.OrderMarkedUnavailable{}},
		{"EmptyData", domain.OrderApproved{}, domain.OrderApproved{}},
		{"CustomerOrderStats", stats, domain.CustomerOrderStats{}},
		{"DailySalesReport", sales, orderhttp.DailySalesReport{}},
		{"DailySales", sales.Days[0], domain.DailySales{}},
		{"Problem", problem, orderhttp.Problem{}},
		{"FieldError", domain.FieldError{Field: "f", Detail: "d"}, domain.FieldError{}},
		{"Job", job, jobs.Job{}},
		{"ReplaySpec", spec, jobs.ReplaySpec{}},
		{"Task", task, jobs.Task{}},
		{"Resume", resume, jobs.Resume{}},
		{"VerifyReport", report, projection.VerifyReport{}},
		{"DriftExample", drift, projection.DriftExample{}},
		{"ProjectionStatus", projStatus, admin.ProjectionStatus{}},
		{"PartitionStatus", partition, projector.PartitionStatus{}},
		{"VerifySummary", verifySummary, jobs.VerifySummary{}},
		{"JobSummary", jobSummary, jobs.JobSummary{}},
		{"DeadLetter", dead, projector.DeadLetter{}},
		{"ReadModelCheck", check, projection.ReadModelCheck{}},
		{"LogCommit", logCommit, domain.LogCommit{}},
		{"LogPage", logPage, domain.LogPage{}},
		{"History", history, admin.History{}},
		{"HistorySample", sample, admin.HistorySample{}},
		{"ProjectionSample", projSample, admin.ProjectionSample{}},
		{"RelaySample", relaySample, admin.RelaySample{}},
	} {
		s := componentSchema(doc, c.schema)
		if s == nil {
			t.Errorf("no schema %s", c.schema)
			continue
		}
		props, required := schemaProps(t, s)
		if got := jsonKeys(t, c.full); !slices.Equal(props, got) {
			t.Errorf("schema %s: properties %v, the Go type writes %v (%T)", c.schema, props, got, c.full)
		}
		if got := jsonKeys(t, c.zero); !slices.Equal(required, got) {
			t.Errorf("schema %s: required %v, the Go type always writes %v (%T)", c.schema, required, got, c.zero)
		}
	}
}

// TestOpenAPIRequestExamples sends every example of every request body
// schema to its route: the strict decoder must accept it, the examples
// together must show every property, and a 2xx answer must have the
// properties its response schema lists.
func TestOpenAPIRequestExamples(t *testing.T) {
	e := newOpenAPIEnv(t)
	_, doc := openAPIDoc(t, e)
	paths := doc["paths"].(map[string]any)
	seq := 0
	sent := 0
	for _, route := range documentedRoutes(doc) {
		method, path, _ := strings.Cut(route, " ")
		op := paths[path].(map[string]any)[strings.ToLower(method)].(map[string]any)
		body, ok := op["requestBody"].(map[string]any)
		if !ok {
			continue
		}
		media, _ := body["content"].(map[string]any)["application/json"].(map[string]any)
		schema := deref(doc, media["schema"])
		if schema == nil {
			t.Errorf("%s: no request schema", route)
			continue
		}
		examples, _ := schema["examples"].([]any)
		if len(examples) == 0 {
			t.Errorf("%s: the request schema has no examples", route)
			continue
		}
		props, required := schemaProps(t, schema)
		var shown []string
		for _, ex := range examples {
			b, _ := json.Marshal(ex)
			keys := jsonKeys(t, b)
			for _, k := range keys {
				if !slices.Contains(shown, k) {
					shown = append(shown, k)
				}
			}
			if m := missing(required, keys); len(m) > 0 {
				t.Errorf("%s: example %s lacks required %v", route, b, m)
			}
			seq++
			target := strings.NewReplacer("{name}", "order_summaries", "{job}", "job-x", "{id}", fmt.Sprintf("oa-%d", seq)).Replace(path)
			if strings.HasPrefix(path, "/v1/orders/{id}/") {
				e.place(t, fmt.Sprintf("oa-%d", seq))
			}
			rec := e.do(t, req{Method: method, Path: target, Body: string(b), Header: map[string]string{"Authorization": "Bearer " + adminToken}})
			sent++
			switch rec.Code {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
				t.Errorf("%s %s with example %s: %d %s", method, target, b, rec.Code, rec.Body)
				continue
			}
			if rec.Code >= 500 {
				t.Errorf("%s %s with example %s: %d %s", method, target, b, rec.Code, rec.Body)
				continue
			}
			if rec.Code >= 300 {
				continue // e.g. 409 for a second rebuild: the body was accepted
			}
			resp := deref(doc, op["responses"].(map[string]any)[strconv.Itoa(rec.Code)])
			if resp == nil {
				t.Errorf("%s: answered %d, which is not documented", route, rec.Code)
				continue
			}
			for name := range resp["headers"].(map[string]any) {
				if name == "Idempotent-Replayed" {
					continue // only on replays
				}
				if rec.Header().Get(name) == "" {
					t.Errorf("%s: documented header %s is not in the %d answer", route, name, rec.Code)
				}
			}
			rs := deref(doc, resp["content"].(map[string]any)["application/json"].(map[string]any)["schema"])
			rprops, rrequired := schemaProps(t, rs)
			got := jsonKeys(t, rec.Body.Bytes())
			if m := missing(got, rprops); len(m) > 0 {
				t.Errorf("%s: the %d answer has fields %v not in its schema", route, rec.Code, m)
			}
			if m := missing(rrequired, got); len(m) > 0 {
				t.Errorf("%s: the %d answer lacks required %v", route, rec.Code, m)
			}
		}
		sort.Strings(shown)
		if !slices.Equal(shown, props) {
			t.Errorf("%s: the examples show %v, the schema has %v", route, shown, props)
		}
	}
	if sent == 0 {
		t.Error("no request body was sent")
	}
	t.Logf("%d example bodies sent", sent)
}
