package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/cmd/orderd/operator"
)

// statusRows reads the table "orderd status" printed: for each projection,
// its cells by column heading. Cells are cut at the columns' offsets in the
// heading line (tabwriter aligns them), so cells with spaces read whole.
func statusRows(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "PROJECTION ") {
		t.Fatalf("no table heading in:\n%s", out)
	}
	head := lines[0]
	starts := regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(head, -1)
	rows := map[string]map[string]string{}
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			break // the notes follow an empty line
		}
		row := map[string]string{}
		for i, s := range starts {
			end := len(l)
			if i+1 < len(starts) {
				end = min(starts[i+1][0], len(l))
			}
			if s[0] < end {
				row[head[s[0]:s[1]]] = strings.TrimSpace(l[s[0]:end])
			}
		}
		rows[row["PROJECTION"]] = row
	}
	return rows
}

// TestStatus runs "orderd status" against the running program: after an
// order is projected, the table lists the projection, order_summaries,
// never verified; once it is verified, with its active collection, a
// lag, no dead letters and the verify's outcome; then the errors an
// operator meets first.
func TestStatus(t *testing.T) {
	m := runMainDir(t, t.TempDir(), func(c *Config) { c.HTTP.AdminToken = testAdminToken })
	c := newClient(t, m)
	base := "http://" + m.HTTPAddr
	env := map[string]string{"ADMIN_TOKEN": testAdminToken, "ORDERD_URL": base}

	a := c.place("order-status-1", "cust-status", 2, 1250, 300)
	c.summaryEqualsOrder("order-status-1", a.Version)
	c.waitStats("cust-status", func(s customerStats) bool { return s.OrderCount == 1 })
	r := runCLI(t, operator.Status, env)
	if r.err != nil {
		t.Fatalf("status before the verify: %v", r)
	}
	if got := statusRows(t, r.stdout)["order_summaries"]["LAST VERIFY"]; got != "-" {
		t.Errorf("order_summaries before the verify: last verify %q, want - (never verified)", got)
	}
	if r := runCLI(t, operator.Verify, env, "order_summaries", "-interval", "100ms"); r.err != nil {
		t.Fatalf("verify: %v", r)
	}

	r = runCLI(t, operator.Status, env)
	if r.err != nil {
		t.Fatalf("status: %v", r)
	}
	for _, col := range []string{"PROJECTION", "ACTIVE COLLECTION", "LAG", "DEAD LETTERS", "LAST VERIFY", "LAST REBUILD", "LAST ERROR"} {
		if !strings.Contains(strings.SplitN(r.stdout, "\n", 2)[0], col) {
			t.Errorf("heading lacks %s:\n%s", col, r.stdout)
		}
	}
	rows := statusRows(t, r.stdout)
	if len(rows) != 2 {
		t.Errorf("%d rows, want 2:\n%s", len(rows), r.stdout)
	}
	for _, name := range []string{"order_summaries", "daily_sales"} {
		row, ok := rows[name]
		if !ok {
			t.Errorf("no row for %s:\n%s", name, r.stdout)
			continue
		}
		if got := row["ACTIVE COLLECTION"]; got != name {
			t.Errorf("%s: active collection %q, want %q (never rebuilt)", name, got, name)
		}
		if lag, err := strconv.ParseUint(row["LAG"], 10, 64); err != nil {
			t.Errorf("%s: lag %q, want a number (the consumer's)", name, row["LAG"])
		} else if lag > 1 {
			t.Logf("%s: lag %d right after the order was projected", name, lag)
		}
		for col, want := range map[string]string{"DEAD LETTERS": "0", "LAST REBUILD": "-", "LAST ERROR": "-"} {
			if got := row[col]; got != want {
				t.Errorf("%s: %s %q, want %q", name, col, got, want)
			}
		}
	}
	if got := rows["order_summaries"]["LAST VERIFY"]; !regexp.MustCompile(`^clean (just now|\d+s ago)$`).MatchString(got) {
		t.Errorf("order_summaries: last verify %q, want \"clean <age>\"", got)
	}
	// The partitions: each held by this, the only projector, or free for
	// a moment (a lease it let lapse under load), each with a lag in
	// events and in seconds.
	_, parts, ok := strings.Cut(r.stdout, "\n\nPROJECTION ")
	if !ok {
		t.Fatalf("no partition table:\n%s", r.stdout)
	}
	applied := map[string]int{}
	n, owned := 0, 0
	for _, l := range strings.Split(parts, "\n")[1:] {
		f := strings.Fields(l)
		if len(f) == 0 {
			break
		}
		n++
		if len(f) != 8 || (f[2] != m.Config.instanceID() && f[2] != "-") {
			t.Errorf("partition row %q: want 8 cells, owner %s or -", l, m.Config.instanceID())
			continue
		}
		if f[2] != "-" {
			owned++
		}
		if _, err := strconv.ParseUint(f[4], 10, 64); err != nil {
			t.Errorf("partition row %q: lag not a number", l)
		}
		if secs, ok := strings.CutSuffix(f[5], "s"); !ok {
			t.Errorf("partition row %q: behind not in seconds", l)
		} else if v, err := strconv.ParseFloat(secs, 64); err != nil || v < 0 {
			t.Errorf("partition row %q: behind not a number of seconds", l)
		}
		k, _ := strconv.Atoi(f[6])
		applied[f[0]] += k
	}
	if owned == 0 {
		t.Errorf("no partition has an owner:\n%s", r.stdout)
	}
	// The summaries' partitions and the daily sales rollup's one.
	if n != m.Config.Projector.Partitions+1 {
		t.Errorf("%d partition rows, want %d:\n%s", n, m.Config.Projector.Partitions+1, r.stdout)
	}
	t.Logf("events applied by partition owners, as of their last heartbeats: %v", applied)

	t.Run("dispatch", func(t *testing.T) {
		t.Setenv("ADMIN_TOKEN", testAdminToken)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var stdout, stderr bytes.Buffer
		if err := run(ctx, []string{"status", "-url", base}, &stdout, &stderr); err != nil {
			t.Fatalf("orderd status -url %s: %v\n%s", base, err, stderr.String())
		}
		if rows := statusRows(t, stdout.String()); rows["order_summaries"] == nil {
			t.Errorf("orderd status:\n%s", stdout.String())
		}
	})

	t.Run("errors", func(t *testing.T) {
		r := runCLI(t, operator.Status, map[string]string{"ADMIN_TOKEN": "wrong", "ORDERD_URL": base})
		if r.err == nil || !strings.Contains(r.err.Error(), "HTTP 401") ||
			!strings.Contains(r.err.Error(), "hint: the token in $ADMIN_TOKEN is not the server's ADMIN_TOKEN") {
			t.Errorf("wrong token: %v", r.err)
		}
		if r.stdout != "" {
			t.Errorf("wrong token printed a table:\n%s", r.stdout)
		}
		r = runCLI(t, operator.Status, map[string]string{"ORDERD_URL": base})
		if r.err == nil || !strings.Contains(r.err.Error(), "set ADMIN_TOKEN") {
			t.Errorf("no token: %v", r.err)
		}
		r = runCLI(t, operator.Status, env, "order_summaries")
		if r.err == nil || !strings.Contains(r.err.Error(), "unexpected arguments") {
			t.Errorf("an argument: %v", r.err)
		}
		r = runCLI(t, operator.Status, env, "-h")
		if r.err != nil || !strings.Contains(r.stderr, "Usage: orderd status") || !strings.Contains(r.stderr, "ADMIN_TOKEN") ||
			!strings.Contains(r.stderr, "LAST VERIFY") || !strings.Contains(r.stderr, "-url") {
			t.Errorf("status -h: %v", r)
		}
		if strings.Contains(r.stderr, "-interval") {
			t.Errorf("status -h offers -interval, which it has no use for:\n%s", r.stderr)
		}
	})
}
