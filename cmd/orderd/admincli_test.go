package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/cmd/orderd/operator"
	"github.com/orderd/orderd/jobs"
)

const testAdminToken = "test-admin-token"

// runAdminMain boots the program with the admin routes on and repair jobs
// tuned to finish quickly.
func runAdminMain(t *testing.T) *Main {
	t.Helper()
	return runMainDir(t, t.TempDir(), func(c *Config) {
		c.HTTP.AdminToken = testAdminToken
		c.Jobs.Settle = 200 * time.Millisecond
		c.Jobs.Grace = 10 * time.Minute // what a rebuild replaces stays for a switch back
		c.Jobs.LeaseTTL = 5 * time.Second
	})
}

// cliRun is one run of an admin subcommand.
type cliRun struct {
	stdout, stderr string
	err            error
}

func (r cliRun) String() string {
	return fmt.Sprintf("err: %v\nstdout:\n%s\nstderr:\n%s", r.err, r.stdout, r.stderr)
}

// runCLI calls an admin subcommand's main with env as its environment.
func runCLI(t *testing.T, main func(context.Context, []string, func(string) string, io.Writer, io.Writer) error,
	env map[string]string, args ...string) cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := main(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr)
	r := cliRun{stdout: stdout.String(), stderr: stderr.String(), err: err}
	t.Logf("%v:\n%v", args, r)
	return r
}

// tableValue returns the value of a row "  <key>  <value>" of a printed
// table, or "" when there is no such row.
func tableValue(out, key string) string {
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(key) + `  +(.*)$`).FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(m[1])
}

// TestAdminCLI runs "orderd verify" and "orderd rebuild" against the
// running program: a clean verify, drift made behind the service's back
// found and repaired, a rebuild that switches the active collection, and
// the errors an operator meets first.
func TestAdminCLI(t *testing.T) {
	m := runAdminMain(t)
	c := newClient(t, m)
	base := "http://" + m.HTTPAddr
	env := map[string]string{"ADMIN_TOKEN": testAdminToken, "ORDERD_URL": base}

	versions := map[string]int64{}
	for i := range 4 {
		id := fmt.Sprintf("order-cli-%d", i)
		c.place(id, "cust-cli", int64(i+1), 1000, 100)
		versions[id] = 1
	}
	c.step("order-cli-0", "approve")
	c.step("order-cli-0", "ship")
	versions["order-cli-0"] = 3
	c.step("order-cli-1", "approve")
	versions["order-cli-1"] = 2
	for id, v := range versions {
		c.summaryEqualsOrder(id, v)
	}

	t.Run("verify clean", func(t *testing.T) {
		r := runCLI(t, operator.Verify, env, "order_summaries", "-wait", "-interval", "100ms")
		if r.err != nil {
			t.Fatalf("verify: %v", r)
		}
		if !strings.Contains(r.stderr, "verify succeeded") {
			t.Errorf("no progress on stderr: %q", r.stderr)
		}
		for key, want := range map[string]string{"missing": "0", "stale": "0", "extra": "0", "different": "0",
			"drift": "0", "repaired": "0", "documents": "4", "streams": "4", "events": "7", "digests match": "yes"} {
			if got := tableValue(r.stdout, key); got != want {
				t.Errorf("row %q = %q, want %q", key, got, want)
			}
		}
		if d := tableValue(r.stdout, "digest"); d == "" || d != tableValue(r.stdout, "expected digest") {
			t.Errorf("digests differ or are missing:\n%s", r.stdout)
		}
		if !strings.Contains(r.stdout, "result: OK") {
			t.Errorf("no OK result:\n%s", r.stdout)
		}

		r = runCLI(t, operator.Verify, env, "order_summaries", "-wait=false")
		if r.err != nil || !strings.Contains(r.stdout, "job: "+base+"/v1/admin/projections/order_summaries/verifications/") {
			t.Errorf("verify -wait=false: want the job's URL and no error, got %v", r)
		}
	})

	t.Run("verify finds and repairs drift", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		coll := m.mongo.Database(m.Config.Mongo.Database).Collection("order_summaries")
		res, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "order-cli-2"}})
		if err != nil || res.DeletedCount != 1 {
			t.Fatalf("delete a summary behind the service's back: %v, %+v", err, res)
		}

		r := runCLI(t, operator.Verify, env, "-interval", "100ms", "order_summaries")
		if r.err == nil || !strings.Contains(r.err.Error(), "-repair") {
			t.Errorf("verify with drift: want an error suggesting -repair, got %v", r.err)
		}
		if got := tableValue(r.stdout, "missing"); got != "1" {
			t.Errorf("missing = %q, want 1:\n%s", got, r.stdout)
		}
		if got := tableValue(r.stdout, "digests match"); got != "no" {
			t.Errorf("digests match = %q, want no", got)
		}
		if !regexp.MustCompile(`(?m)^  missing\s+order-cli-2\s+0\s+1\s+-$`).MatchString(r.stdout) {
			t.Errorf("no example row for the missing summary:\n%s", r.stdout)
		}

		r = runCLI(t, operator.Verify, env, "order_summaries", "-repair", "-interval", "100ms")
		if r.err != nil {
			t.Fatalf("verify -repair: %v", r)
		}
		if tableValue(r.stdout, "missing") != "1" || tableValue(r.stdout, "repaired") != "1" {
			t.Errorf("verify -repair: want missing 1, repaired 1:\n%s", r.stdout)
		}

		r = runCLI(t, operator.Verify, env, "order_summaries", "-interval", "100ms")
		if r.err != nil || tableValue(r.stdout, "drift") != "0" || tableValue(r.stdout, "digests match") != "yes" {
			t.Errorf("verify after the repair: want clean, got %v", r)
		}
		c.summaryEqualsOrder("order-cli-2", versions["order-cli-2"])
	})

	t.Run("rebuild", func(t *testing.T) {
		r := runCLI(t, operator.Rebuild, env, "order_summaries", "-wait", "-partitions", "2", "-interval", "100ms")
		if r.err != nil {
			t.Fatalf("rebuild -wait: %v", r)
		}
		if !regexp.MustCompile(`(?m)^rebuild \S+ of order_summaries: succeeded$`).MatchString(r.stdout) {
			t.Errorf("no succeeded line:\n%s", r.stdout)
		}
		if !strings.Contains(r.stdout, "/v1/admin/projections/order_summaries/rebuilds/") {
			t.Errorf("no job URL:\n%s", r.stdout)
		}
		if got := tableValue(r.stdout, "streams"); got != "4" {
			t.Errorf("streams = %q, want 4", got)
		}
		if !strings.Contains(r.stdout, "verify before switch") || tableValue(r.stdout, "digests match") == "" {
			t.Errorf("no verify-before-switch report:\n%s", r.stdout)
		}
		if !strings.Contains(r.stderr, "rebuild ") {
			t.Errorf("no progress on stderr: %q", r.stderr)
		}
		// The summary splits the run into the scan and the verify and
		// switch after it, instead of calling all of it scanning.
		if d := tableValue(r.stdout, "duration"); !regexp.MustCompile(`\(scanning \S+, verifying and switching \S+\)$`).MatchString(d) {
			t.Errorf("duration %q, want the scan and the verify and switch apart", d)
		}
		active := tableValue(r.stdout, "active collection")

		var list struct {
			Projections []struct {
				Name             string `json:"name"`
				ActiveCollection string `json:"active_collection"`
			} `json:"projections"`
		}
		c.must(http.StatusOK, "GET", "/v1/admin/projections", "", "Authorization", "Bearer "+testAdminToken).decode(t, &list)
		found := false
		for _, p := range list.Projections {
			if p.Name == "order_summaries" {
				found = true
				if p.ActiveCollection == "order_summaries" || p.ActiveCollection != active {
					t.Errorf("active collection %q after the rebuild; the CLI printed %q", p.ActiveCollection, active)
				}
			}
		}
		if !found {
			t.Errorf("order_summaries not in %+v", list.Projections)
		}
		for id, v := range versions {
			c.summaryEqualsOrder(id, v)
		}

		// A rebuild started without -wait returns at once with the job id.
		r = runCLI(t, operator.Rebuild, env, "order_summaries")
		if r.err != nil || !strings.Contains(r.stdout, "-cancel ") {
			t.Fatalf("rebuild without -wait: %v", r)
		}
		started := regexp.MustCompile(`started: job (\S+) `).FindStringSubmatch(r.stdout)
		if started == nil {
			t.Fatalf("no job id in %q", r.stdout)
		}
		// It runs on: the next rebuild of the projection waits for its end
		// (one rebuild of a projection at a time).
		var job struct {
			State jobs.JobState `json:"state"`
		}
		if !waitFor(time.Minute, 100*time.Millisecond, func() bool {
			c.must(http.StatusOK, "GET", "/v1/admin/projections/order_summaries/rebuilds/"+started[1], "",
				"Authorization", "Bearer "+testAdminToken).decode(t, &job)
			return job.State.Final()
		}) || job.State != jobs.StateSucceeded {
			t.Fatalf("the rebuild started without -wait: %s, want succeeded", job.State)
		}
	})

	t.Run("interrupted wait and cancel", func(t *testing.T) {
		// Ctrl-C (the context ending) once the first progress line shows:
		// the CLI stops waiting, and the job is left running.
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		var stdout bytes.Buffer
		stderr := &cancelOnWrite{cancel: cancel}
		err := operator.Rebuild(ctx, []string{"order_summaries", "-wait", "-interval", "50ms"},
			func(k string) string { return env[k] }, &stdout, stderr)
		t.Logf("interrupted rebuild: err %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.b.String())
		if err == nil || !strings.Contains(err.Error(), "keeps running") {
			t.Fatalf("interrupted wait: err %v, want one saying the job keeps running", err)
		}
		m := regexp.MustCompile(`started: job (\S+) `).FindStringSubmatch(stdout.String())
		if m == nil {
			t.Fatalf("no job id in %q", stdout.String())
		}
		id := m[1]
		for _, want := range []string{"keeps running", "curl -H", "orderd rebuild order_summaries -cancel " + id} {
			if !strings.Contains(stderr.b.String(), want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr.b.String())
			}
		}
		var job struct {
			State string `json:"state"`
		}
		c.must(http.StatusOK, "GET", "/v1/admin/projections/order_summaries/rebuilds/"+id, "",
			"Authorization", "Bearer "+testAdminToken).decode(t, &job)
		if job.State == "canceled" {
			t.Fatalf("the interrupted wait canceled the job")
		}

		// -cancel stops it; -wait follows it until it is canceled.
		r := runCLI(t, operator.Rebuild, env, "order_summaries", "-cancel", id, "-wait", "-interval", "50ms")
		if r.err != nil && strings.Contains(r.err.Error(), "/problems/job-finished") || strings.Contains(fmt.Sprint(r.err), "already finished") {
			t.Skipf("the rebuild finished before the cancel reached it (a loaded machine): %v", r.err)
		}
		if r.err != nil || !strings.Contains(r.stdout, "cancel requested for rebuild "+id) ||
			!regexp.MustCompile(`(?m)^rebuild \S+ of order_summaries: canceled$`).MatchString(r.stdout) {
			// The job with its tasks (state, owner, lease) tells whether a
			// jobs worker claimed the cancel.
			j := c.do("GET", "/v1/admin/projections/order_summaries/rebuilds/"+id, "", "Authorization", "Bearer "+testAdminToken)
			t.Fatalf("rebuild -cancel -wait: %v\njob now: %v", r, j)
		}
		r = runCLI(t, operator.Rebuild, env, "order_summaries", "-cancel", id)
		if r.err == nil || !strings.Contains(r.err.Error(), "HTTP 409") {
			t.Errorf("cancel of a finished job: %v", r.err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		bad := map[string]string{"ADMIN_TOKEN": "wrong", "ORDERD_URL": base}
		r := runCLI(t, operator.Verify, bad, "order_summaries")
		if r.err == nil || !strings.Contains(r.err.Error(), "HTTP 401") || !strings.Contains(r.err.Error(), "ADMIN_TOKEN") {
			t.Errorf("wrong token: %v", r.err)
		}
		r = runCLI(t, operator.Rebuild, env, "no_such_projection")
		if r.err == nil || !strings.Contains(r.err.Error(), "Not found") || !strings.Contains(r.err.Error(), "HTTP 404") ||
			!strings.Contains(r.err.Error(), "the projections are daily_sales, order_summaries") {
			t.Errorf("unknown projection: %v", r.err)
		}
		r = runCLI(t, operator.Verify, map[string]string{"ORDERD_URL": base}, "order_summaries")
		if r.err == nil || !strings.Contains(r.err.Error(), "set ADMIN_TOKEN") {
			t.Errorf("no token: %v", r.err)
		}
		r = runCLI(t, operator.Rebuild, env, "order_summaries", "-cancel", "no-such-job")
		if r.err == nil || !strings.Contains(r.err.Error(), "HTTP 404") {
			t.Errorf("cancel of an unknown job: %v", r.err)
		}
		r = runCLI(t, operator.Rebuild, env, "-wait")
		if r.err == nil || !strings.Contains(r.err.Error(), "name the projection") {
			t.Errorf("no projection: %v", r.err)
		}
		r = runCLI(t, operator.Verify, env, "-h")
		if r.err != nil || !strings.Contains(r.stderr, "ADMIN_TOKEN") || !strings.Contains(r.stderr, "orderd verify order_summaries") {
			t.Errorf("verify -h: %v", r)
		}
	})
}

// cancelOnWrite is a writer that calls cancel on its first write, as an
// operator pressing Ctrl-C once the progress shows.
type cancelOnWrite struct {
	b      bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.b.Write(p)
}

// TestAdminCLI_AdminRoutesOff checks the hint given when the service runs
// without ADMIN_TOKEN: its admin routes answer 404 like any unknown path.
// It listens beyond loopback, so that the development mode (devMode)
// makes no token of its own.
func TestAdminCLI_AdminRoutesOff(t *testing.T) {
	m := runMainDir(t, t.TempDir(), func(c *Config) { c.HTTPAddr = "0.0.0.0:0" })
	_, port, _ := net.SplitHostPort(m.HTTPAddr)
	r := runCLI(t, operator.Verify, map[string]string{"ADMIN_TOKEN": "x", "ORDERD_URL": "http://127.0.0.1:" + port}, "order_summaries")
	if r.err == nil || !strings.Contains(r.err.Error(), "HTTP 404") || !strings.Contains(r.err.Error(), "without ADMIN_TOKEN") {
		t.Errorf("admin routes off: %v", r.err)
	}
}

// TestAdminCLI_DevModeToken: in a fresh shell, with no ADMIN_TOKEN and no
// server named (MONGODB_URI, NATS_URL), the admin commands use the token
// the development mode's server keeps in its data dir (ORDERD_DATA_DIR or
// -data-dir); a shell that names a server, or a dir without a token, gets
// the refusal, which says where it looked.
func TestAdminCLI_DevModeToken(t *testing.T) {
	dir := t.TempDir()
	m := runMainEmbedded(t, dir)
	if !m.devToken {
		t.Fatal("the server is not in the development mode")
	}
	base := "http://" + m.HTTPAddr
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"ORDERD_DATA_DIR", map[string]string{"ORDERD_URL": base, "ORDERD_DATA_DIR": dir}, nil},
		{"-data-dir", map[string]string{"ORDERD_URL": base}, []string{"-data-dir", dir}},
	} {
		r := runCLI(t, operator.Status, tc.env, tc.args...)
		if r.err != nil || !strings.Contains(r.stdout, "order_summaries") {
			t.Errorf("%s: status with the development mode's token: %v", tc.name, r)
		}
	}
	r := runCLI(t, operator.Status, map[string]string{"ORDERD_URL": base, "ORDERD_DATA_DIR": dir, "NATS_URL": "nats://elsewhere:4222"})
	if r.err == nil || !strings.Contains(r.err.Error(), "no admin token") {
		t.Errorf("a shell naming a server used the development mode's token: %v", r)
	}
	empty := t.TempDir()
	r = runCLI(t, operator.Status, map[string]string{"ORDERD_URL": base, "ORDERD_DATA_DIR": empty})
	if r.err == nil || !strings.Contains(r.err.Error(), "no admin token") || !strings.Contains(r.err.Error(), filepath.Join(empty, "admin-token")) {
		t.Errorf("no token anywhere: %v", r)
	}
}
