package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const dashboardPath = "../../deployments/grafana/orderd-dashboard.json"

// operationsPath is the guide that lists the metrics.
const operationsPath = "../../docs/operations.md"

// metricName matches the names of the program's and the Go client's
// metrics in PromQL.
var metricName = regexp.MustCompile(`\b(?:orderd|process|go)_[a-z0-9_]*[a-z0-9]\b`)

// dashboardQueries returns every PromQL text of a Grafana dashboard: the
// panels' target expressions and the variables' queries, each with where
// it is.
func dashboardQueries(v any, where string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		if title, ok := v["title"].(string); ok {
			where = title
		} else if name, ok := v["name"].(string); ok {
			where = "variable " + name
		}
		for k, x := range v {
			switch s, isString := x.(string); {
			case isString && (k == "expr" || k == "definition" || (k == "query" && strings.Contains(s, "("))):
				out[s] = where
			default:
				dashboardQueries(x, where, out)
			}
		}
	case []any:
		for _, x := range v {
			dashboardQueries(x, where, out)
		}
	}
}

// exposedFamilies reads the families of a /metrics answer (text format):
// name to type, from the TYPE lines.
func exposedFamilies(body string) map[string]string {
	fams := map[string]string{}
	for _, l := range strings.Split(body, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			fams[f[2]] = f[3]
		}
	}
	return fams
}

// missingMetrics returns the names that no family of fams provides: a
// name is provided by a family of that name, or, with the suffix _bucket,
// _sum or _count, by a histogram (or, but for _bucket, a summary) of the
// name without it.
func missingMetrics(names []string, fams map[string]string) []string {
	var missing []string
	for _, n := range names {
		if _, ok := fams[n]; ok {
			continue
		}
		ok := false
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(n, suf); cut {
				typ := fams[base]
				ok = typ == "histogram" || (typ == "summary" && suf != "_bucket")
			}
		}
		if !ok {
			missing = append(missing, n)
		}
	}
	return missing
}

// dashboardRequired are metrics the dashboard must chart.
var dashboardRequired = []string{
	"orderd_command_duration_seconds_bucket",
	"orderd_read_request_duration_seconds_bucket",
	"orderd_read_request_duration_seconds_count",
	"orderd_read_request_errors_total",
	"orderd_projection_partition_lag",
	"orderd_projection_partition_events_applied_total",
}

// TestDashboard checks the Grafana dashboard against the running program:
// every metric its queries name is exposed by GET /metrics, once one
// order went through the API and the projections (families with labels
// show only once they have a series).
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	checkDashboardShape(t, dash)

	queries := map[string]string{}
	dashboardQueries(dash, "dashboard", queries)
	used := map[string][]string{} // metric name: where
	for q, where := range queries {
		for _, n := range metricName.FindAllString(q, -1) {
			if !slices.Contains(used[n], where) {
				used[n] = append(used[n], where)
			}
		}
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("%d queries name %d metrics: %s", len(queries), len(names), strings.Join(names, " "))
	if len(queries) < 20 || len(names) < 20 {
		t.Fatalf("found only %d queries naming %d metrics in %s; is the walk of the JSON broken?", len(queries), len(names), dashboardPath)
	}

	// The panels operators asked for are there: latency of commands and
	// reads, read errors, and each partition's lag and apply rate.
	for _, n := range dashboardRequired {
		if len(used[n]) == 0 {
			t.Errorf("no panel of %s queries %s", dashboardPath, n)
		}
	}

	// The check itself finds a metric that does not exist.
	if got := missingMetrics([]string{"orderd_no_such_metric_total", "orderd_append_duration_seconds_bucket", "go_goroutines_bucket"},
		map[string]string{"orderd_append_duration_seconds": "histogram", "go_goroutines": "gauge"}); !slices.Equal(got, []string{"orderd_no_such_metric_total", "go_goroutines_bucket"}) {
		t.Fatalf("missingMetrics = %v", got)
	}

	m := runMain(t)
	c := newClient(t, m)
	a := c.place("order-dash-1", "cust-dash", 1, 990, 0)
	c.summaryEqualsOrder("order-dash-1", a.Version)
	c.waitStats("cust-dash", func(s customerStats) bool { return s.OrderCount == 1 })
	// A read error, so that the read errors' family has a series.
	c.must(http.StatusNotFound, "GET", "/v1/orders/order-dash-none", "")

	// The samplers (consumer lag, dead letters) run at each projector's
	// start: allow them a moment.
	var missing []string
	var fams map[string]string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		fams = exposedFamilies(string(c.must(http.StatusOK, "GET", "/metrics", "").Body))
		if missing = missingMetrics(names, fams); len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, n := range missing {
		t.Errorf("%s names %s (in %s), which GET /metrics does not expose", dashboardPath, n, strings.Join(used[n], ", "))
	}
	// The operations guide lists every metric of the program.
	ops, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	for f := range fams {
		if strings.HasPrefix(f, "orderd_") && !strings.Contains(string(ops), "`"+f+"`") {
			t.Errorf("%s does not list %s, which GET /metrics exposes", operationsPath, f)
		}
	}
	if len(missing) > 0 {
		var have []string
		for f := range fams {
			have = append(have, f)
		}
		slices.Sort(have)
		t.Logf("GET /metrics exposes: %s", strings.Join(have, " "))
	}
}

// checkDashboardShape checks what Grafana needs to import the dashboard
// and show every panel from the data source variable.
func checkDashboardShape(t *testing.T, dash map[string]any) {
	t.Helper()
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v, want a current one (39)", dash["schemaVersion"])
	}
	if dash["title"] == "" || dash["uid"] == "" {
		t.Errorf("no title or uid")
	}
	var vars []string
	if tl, ok := dash["templating"].(map[string]any); ok {
		list, _ := tl["list"].([]any)
		for _, x := range list {
			v, _ := x.(map[string]any)
			vars = append(vars, fmt.Sprint(v["name"]))
			if v["name"] == "DS_PROMETHEUS" && (v["type"] != "datasource" || v["query"] != "prometheus") {
				t.Errorf("variable DS_PROMETHEUS is %v of %v, want a datasource variable of prometheus", v["type"], v["query"])
			}
		}
	}
	if !slices.Contains(vars, "DS_PROMETHEUS") {
		t.Errorf("no DS_PROMETHEUS variable among %v", vars)
	}
	panels, _ := dash["panels"].([]any)
	ids := map[float64]bool{}
	type rect struct {
		title      any
		x, y, w, h float64
	}
	var placed []rect
	graphs := 0
	for _, x := range panels {
		p, _ := x.(map[string]any)
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel id %v used twice", id)
		}
		ids[id] = true
		pos, _ := p["gridPos"].(map[string]any)
		if w, _ := pos["w"].(float64); w <= 0 || w+pos["x"].(float64) > 24 {
			t.Errorf("panel %q: gridPos %v outside the 24 columns", p["title"], pos)
		}
		// Grafana moves an overlapping panel down on import, out of its row.
		r := rect{p["title"], pos["x"].(float64), pos["y"].(float64), pos["w"].(float64), pos["h"].(float64)}
		for _, o := range placed {
			if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
				t.Errorf("panels %q and %q overlap", r.title, o.title)
			}
		}
		placed = append(placed, r)
		if p["type"] == "row" {
			continue
		}
		graphs++
		if ds, _ := p["datasource"].(map[string]any); ds["uid"] != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: data source %v, want ${DS_PROMETHEUS}", p["title"], p["datasource"])
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", p["title"])
		}
		for _, y := range targets {
			tg, _ := y.(map[string]any)
			if e, _ := tg["expr"].(string); strings.TrimSpace(e) == "" {
				t.Errorf("panel %q: a target without expr", p["title"])
			}
		}
	}
	if graphs < 15 {
		t.Errorf("%d panels, want the full set", graphs)
	}
}
