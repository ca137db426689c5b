package http_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
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

func TestOpenAPI(t *testing.T) {
	e := newOpenAPIEnv(t)
	raw, doc := openAPIDoc(t, e)
	registered, problems := registeredRoutes(e.srv)
	for _, p := range problems {
		t.Error(p)
	}
	documented := documentedRoutes(doc)
	t.Logf("%d routes registered, %d documented", len(registered), len(documented))

	t.Run("document", func(t *testing.T) {
		if v := doc["openapi"]; v != "3.1.0" {
			t.Errorf("openapi = %v, want 3.1.0", v)
		}
		for _, p := range duplicateKeys(raw) {
			t.Errorf("key given twice: %s", p)
		}
		for _, p := range duplicateOperations(doc) {
			t.Error(p)
		}
	})
	t.Run("registered routes are documented", func(t *testing.T) {
		if len(registered) == 0 {
			t.Fatal("the server registered no routes")
		}
		for _, r := range missing(registered, documented) {
			t.Errorf("route %s is registered but not documented in http/openapi.json", r)
		}
	})
	t.Run("documented routes are registered", func(t *testing.T) {
		if len(documented) == 0 {
			t.Fatal("the document has no operations")
		}
		for _, r := range missing(documented, registered) {
			t.Errorf("route %s is documented but not registered", r)
		}
	})
	t.Run("refs resolve", func(t *testing.T) {
		n, bad := checkRefs(doc)
		if n == 0 {
			t.Error("no $ref found: the walk is broken")
		}
		for _, p := range bad {
			t.Error(p)
		}
	})
	t.Run("path parameters", func(t *testing.T) {
		for _, p := range checkPathParams(doc) {
			t.Error(p)
		}
	})
	t.Run("security", func(t *testing.T) {
		for _, p := range checkSecurity(doc) {
			t.Error(p)
		}
	})

	// The checks above must notice one route missing on either side, a
	// duplicate operation and a dangling $ref.
	t.Run("checks are sensitive", func(t *testing.T) {
		for i := range registered {
			fewer := slices.Delete(slices.Clone(registered), i, i+1)
			if got := missing(registered, fewer); !slices.Equal(got, []string{registered[i]}) {
				t.Errorf("dropping %s: missing reports %v", registered[i], got)
			}
			if got := missing(fewer, registered); len(got) != 0 {
				t.Errorf("dropping %s: the other direction reports %v", registered[i], got)
			}
		}
		for i := range documented {
			fewer := slices.Delete(slices.Clone(documented), i, i+1)
			if got := missing(documented, fewer); !slices.Equal(got, []string{documented[i]}) {
				t.Errorf("dropping %s: missing reports %v", documented[i], got)
			}
		}

		var mutated map[string]any
		_ = json.Unmarshal(raw, &mutated)
		paths := mutated["paths"].(map[string]any)
		paths["/v1/orders/{order}"] = map[string]any{"get": map[string]any{"responses": map[string]any{}}}
		if len(duplicateOperations(mutated)) == 0 {
			t.Error("duplicateOperations misses GET /v1/orders/{id} documented twice")
		}
		delete(paths, "/healthz")
		if got := missing(registered, documentedRoutes(mutated)); !slices.Contains(got, "GET /healthz") {
			t.Errorf("with /healthz undocumented, missing reports %v", got)
		}
		paths["/v1/orders/{id}"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)["404"] =
			map[string]any{"$ref": "#/components/responses/NoSuchResponse"}
		if _, bad := checkRefs(mutated); len(bad) != 1 {
			t.Errorf("a dangling $ref: checkRefs reports %v", bad)
		}
		if len(duplicateKeys([]byte(`{"paths": {"/a": {"get": {}, "get": {}}}}`))) != 1 {
			t.Error("duplicateKeys misses a key given twice")
		}
	})
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

// registeredRoutes returns the server's routes as "METHOD /path" with
// echo's ":param" as "{param}", sorted, leaving out echo's not-found
// routes of groups.
func registeredRoutes(srv *orderhttp.Server) (routes, problems []string) {
	for _, r := range srv.Routes() {
		if !slices.Contains(openAPIMethods, strings.ToLower(r.Method)) && r.Method != http.MethodConnect {
			continue // echo.RouteNotFound: a group's catch-all
		}
		segs := strings.Split(r.Path, "/")
		for i, s := range segs {
			switch {
			case strings.HasPrefix(s, ":"):
				segs[i] = "{" + s[1:] + "}"
			case strings.Contains(s, "*"):
				problems = append(problems, fmt.Sprintf("route %s %s: a wildcard cannot be documented as an OpenAPI path", r.Method, r.Path))
			}
		}
		routes = append(routes, r.Method+" "+strings.Join(segs, "/"))
	}
	sort.Strings(routes)
	return routes, problems
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

// duplicateOperations reports operations that are the same route: the same
// method on paths equal but for the names of their parameters
// (/orders/{id} and /orders/{order}), and operationIds used twice.
func duplicateOperations(doc map[string]any) []string {
	var out []string
	seen, ids := map[string]string{}, map[string]string{}
	paths, _ := doc["paths"].(map[string]any)
	keys := make([]string, 0, len(paths))
	for p := range paths {
		keys = append(keys, p)
	}
	sort.Strings(keys)
	for _, path := range keys {
		item, _ := paths[path].(map[string]any)
		for _, m := range openAPIMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			route := strings.ToUpper(m) + " " + path
			norm := strings.ToUpper(m) + " " + templateParam.ReplaceAllString(path, "{}")
			if first, dup := seen[norm]; dup {
				out = append(out, fmt.Sprintf("%s and %s are the same route", first, route))
			}
			seen[norm] = route
			if id, _ := op["operationId"].(string); id != "" {
				if first, dup := ids[id]; dup {
					out = append(out, fmt.Sprintf("operationId %s of %s is also that of %s", id, route, first))
				}
				ids[id] = route
			}
		}
	}
	return out
}

// duplicateKeys returns the JSON pointers of object keys given twice
// (encoding/json would keep the last silently).
func duplicateKeys(b []byte) []string {
	var out []string
	var walk func(dec *json.Decoder, at string) error
	walk = func(dec *json.Decoder, at string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			keys := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				p := at + "/" + pointerEscaper.Replace(key)
				if keys[key] {
					out = append(out, p)
				}
				keys[key] = true
				if err := walk(dec, p); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(dec, at+"/"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
			_, err = dec.Token()
		}
		return err
	}
	if err := walk(json.NewDecoder(bytes.NewReader(b)), ""); err != nil && err != io.EOF {
		out = append(out, "invalid JSON: "+err.Error())
	}
	return out
}

// checkRefs resolves every "$ref" in the document as a local JSON pointer
// and returns how many it found and the ones that do not resolve.
func checkRefs(doc map[string]any) (n int, bad []string) {
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if r, ok := v["$ref"]; ok {
				n++
				s, _ := r.(string)
				if _, err := resolve(doc, s); err != nil {
					bad = append(bad, fmt.Sprintf("%s: $ref %q: %v", at, s, err))
				}
			}
			for k, x := range v {
				walk(x, at+"/"+pointerEscaper.Replace(k))
			}
		case []any:
			for i, x := range v {
				walk(x, at+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(doc, "#")
	sort.Strings(bad)
	return n, bad
}

// JSON pointer (RFC 6901) escaping of reference tokens.
var (
	pointerEscaper   = strings.NewReplacer("~", "~0", "/", "~1")
	pointerUnescaper = strings.NewReplacer("~1", "/", "~0", "~")
)

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

// checkPathParams checks that each operation declares, on its path item
// or itself, exactly the parameters of its path template, as required.
func checkPathParams(doc map[string]any) []string {
	var out []string
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		item, _ := item.(map[string]any)
		var want []string
		for _, m := range templateParam.FindAllString(path, -1) {
			want = append(want, strings.Trim(m, "{}"))
		}
		sort.Strings(want)
		for _, m := range openAPIMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			var got []string
			params, _ := item["parameters"].([]any)
			opParams, _ := op["parameters"].([]any)
			for _, p := range append(slices.Clone(params), opParams...) {
				p := deref(doc, p)
				if p["in"] != "path" {
					continue
				}
				name, _ := p["name"].(string)
				got = append(got, name)
				if p["required"] != true {
					out = append(out, fmt.Sprintf("%s %s: path parameter %s is not required", strings.ToUpper(m), path, name))
				}
			}
			sort.Strings(got)
			if !slices.Equal(got, want) {
				out = append(out, fmt.Sprintf("%s %s: path parameters %v, the template has %v", strings.ToUpper(m), path, got, want))
			}
		}
	}
	return out
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
	spec := domain.ReplaySpec{StreamID: "s", From: at, To: at.Add(time.Hour)}
	resume := domain.Resume{At: at, Owner: "o", Cursor: "c", Events: 1, Streams: 1}
	task := domain.Task{ID: "j/part-0", Job: "j", Name: "part-0", From: "a", To: "b", State: "running", Owner: "o", Epoch: 1,
		LeaseUntil: at, Attempts: 1, Cursor: "a1", Events: 1, Streams: 1, Commits: 1, Poison: 1, Resumes: []domain.Resume{resume},
		StartedAt: at, FinishedAt: at, Error: "e"}
	drift := domain.DriftExample{ID: "o-1", Kind: "different", StoredVersion: 1, LogVersion: 2, Fields: []string{"status"}}
	report := domain.VerifyReport{Collection: "c", Streams: 1, Events: 1, Documents: 1, Missing: 1, Stale: 1, Extra: 1, Different: 1,
		Repaired: 1, PoisonStreams: 1, Examples: []domain.DriftExample{drift}, Digest: "d", ExpectedDigest: "d"}
	job := domain.Job{ID: "j", Kind: domain.KindRebuild, Projection: "p", Version: 2, State: domain.StateRunning, CreatedAt: at, FinishedAt: at,
		Error: "e", Partitions: 2, Shadow: "s", Repair: true, Replay: &spec, TotalCommits: 1, Bounds: []string{"m"}, Report: &report,
		StartedAt: at, Events: 1, Streams: 1, PoisonStreams: 1, RatePerSecond: 1, ETASeconds: 1, CancelRequested: true, Tasks: []domain.Task{task}}
	verifySummary := domain.VerifySummary{Job: "j", State: domain.StateSucceeded, FinishedAt: at, Drift: 1, Repaired: 1, Digest: "d"}
	jobSummary := domain.JobSummary{Job: "j", State: domain.StateFailed, Error: "e"}
	behind := 1.5
	partition := domain.PartitionStatus{Partition: 1, Consumer: "proj_p_p01", Owner: "o", LeaseUntil: at, Epoch: 1, Lag: &lag, LagSeconds: &behind, Applied: 1, ApplyRate: 1}
	projection := domain.ProjectionStatus{Name: "p", Version: 2, ActiveCollection: "a", ActiveVersion: 1, ShadowCollection: "s", ShadowVersion: 2,
		PreviousCollection: "b", PreviousVersion: 1, SwitchedBackFrom: 3, SwitchedAt: at, Generation: 1, ConsumerLag: &lag,
		LastError: "e", DeadLetters: 1, LastVerify: &verifySummary, LastRebuild: &jobSummary, Partitions: []domain.PartitionStatus{partition}, AckFloor: &lag}
	check := domain.ReadModelCheck{Projection: "p", Collection: "c", State: "different", StoredVersion: 1, LogVersion: 1,
		Document: json.RawMessage(`{"version":1}`), Expected: json.RawMessage(`{"version":1}`), Fields: []string{"status"}, FoldError: "e"}
	dead := domain.DeadLetter{ID: "p:1", Projection: "p", StreamID: "s", EventID: "e", Version: 1, Subject: "x", Payload: "{}",
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
		{"Job", job, domain.Job{}},
		{"ReplaySpec", spec, domain.ReplaySpec{}},
		{"Task", task, domain.Task{}},
		{"Resume", resume, domain.Resume{}},
		{"VerifyReport", report, domain.VerifyReport{}},
		{"DriftExample", drift, domain.DriftExample{}},
		{"ProjectionStatus", projection, domain.ProjectionStatus{}},
		{"PartitionStatus", partition, domain.PartitionStatus{}},
		{"VerifySummary", verifySummary, domain.VerifySummary{}},
		{"JobSummary", jobSummary, domain.JobSummary{}},
		{"DeadLetter", dead, domain.DeadLetter{}},
		{"ReadModelCheck", check, domain.ReadModelCheck{}},
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
