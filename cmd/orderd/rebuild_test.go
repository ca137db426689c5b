package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
)

// subprocessEnv makes the test binary run the program instead of the
// tests, so a test can start orderd instances it can kill.
const subprocessEnv = "ORDERD_TEST_RUN_PROGRAM"

func TestMain(m *testing.M) {
	if os.Getenv(subprocessEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "orderd:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	flag.Parse()
	if raceBuild && !*childRace && !*chaosLong && flag.Lookup("test.run").Value.String() == "" {
		// The whole package: the child's build (15 s on a loaded machine)
		// runs while the first tests do, not in the first chaos test.
		go childOnce.Do(buildChild)
	}
	code := m.Run()
	childOnce.Do(func() {}) // a build under way has set childDir
	if childDir != "" {
		_ = os.RemoveAll(childDir)
	}
	os.Exit(code)
}

// instance is an orderd process started by a test.
type instance struct {
	cmd *exec.Cmd
	out *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a process's
// output, a logger's goroutines) and a test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes returns a copy of what was written so far.
func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// childRace runs the orderd child processes of the fault tests under the
// race detector, as the test binary itself run again (built with -race),
// and fails a test whose child reported a data race. Otherwise, in a test
// binary built with -race, the children are orderd built once without it
// (-tags noembed, as production): three short chaos tests took 81 CPU-s
// with race children and 64 without, the build included; and a child's
// race report used to go unread (SIGKILL ends every child). The
// in-process tests of this package and the others run the same roles under
// -race. -chaos.long (make chaos) implies it.
var childRace = flag.Bool("child.race", false, "run the fault tests' orderd child processes under the race detector (implied by -chaos.long)")

var (
	childOnce sync.Once
	childExe  string
	childErr  error
	childDir  string // removed by TestMain
)

// childProgram returns the executable startInstance runs, and whether it
// runs under the race detector.
func childProgram(t testing.TB) (string, bool) {
	t.Helper()
	if !raceBuild || *childRace || *chaosLong {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		return exe, raceBuild
	}
	childOnce.Do(buildChild)
	if childErr != nil {
		t.Fatalf("building orderd for the child processes: %v", childErr)
	}
	return childExe, false
}

// buildChild builds orderd for the child processes into childDir.
func buildChild() {
	childDir, childErr = os.MkdirTemp("", "orderd-child-")
	if childErr != nil {
		return
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	exe := filepath.Join(childDir, "orderd")
	cmd := exec.Command(goCmd, "build", "-tags", "noembed", "-o", exe, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		childErr = fmt.Errorf("go build: %v\n%s", err, out)
		return
	}
	childExe = exe
}

// startInstance runs "orderd serve args..." as a child process; the test's
// cleanup kills it and logs its output if the test failed, or if the child
// ran under the race detector and reported a race.
func startInstance(t testing.TB, name string, args ...string) *instance {
	t.Helper()
	return startInstanceEnv(t, name, nil, args...)
}

// startInstanceEnv is startInstance with env added to the child's
// environment (t.Setenv would keep a test from running in parallel).
func startInstanceEnv(t testing.TB, name string, env []string, args ...string) *instance {
	t.Helper()
	exe, race := childProgram(t)
	in := &instance{cmd: exec.Command(exe, append([]string{"serve"}, args...)...), out: &syncBuffer{}}
	in.cmd.Env = append(append(os.Environ(), subprocessEnv+"=1"), env...)
	in.cmd.Stdout, in.cmd.Stderr = in.out, in.out
	if err := in.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		in.kill()
		out := in.out.Bytes()
		if race && bytes.Contains(out, []byte("WARNING: DATA RACE")) {
			t.Errorf("%s (pid %d): the race detector reported a data race", name, in.cmd.Process.Pid)
		}
		if t.Failed() {
			keepOutput(t, name, in.cmd.Process.Pid, out)
		}
	})
	return in
}

// keepOutput keeps a failed test's process output: the whole of it in a
// file under $TMPDIR/orderd-test-output/<test>, its last lines in the
// test's log. An API under a store outage logs every refused request, and
// tens of thousands of lines in the log would bury the test's own failure
// message.
func keepOutput(t testing.TB, name string, pid int, out []byte) {
	lines := bytes.Split(bytes.TrimRight(out, "\n"), []byte("\n"))
	tail := bytes.Join(lines[max(0, len(lines)-2):], []byte("\n"))
	dir := filepath.Join(os.TempDir(), "orderd-test-output", strings.ReplaceAll(t.Name(), "/", "_"))
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, pid))
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(path, out, 0o644)
	}
	if err != nil {
		t.Logf("output of %s: %d lines, not kept (%v); the last:\n%s", name, len(lines), err, tail)
		return
	}
	t.Logf("output of %s: %d lines in %s; the last:\n%s", name, len(lines), path, tail)
}

// kill stops the process with SIGKILL: no graceful shutdown, no lease
// released, as when a machine dies.
func (in *instance) kill() {
	if in.cmd.ProcessState == nil {
		_ = in.cmd.Process.Kill()
		_ = in.cmd.Wait()
	}
}

// TestMain_RebuildResumesAfterKill runs a rebuild in a jobs-only orderd
// process, kills it with SIGKILL halfway, and checks that a second process
// resumes the rebuild from the saved cursor once the dead one's lease has
// run out: the job succeeds, its partition was claimed twice, the second
// claim started from the first one's checkpoint, every stream is counted
// exactly once (a restart from scratch would count the first part twice),
// and the summaries then read from the new collection equal the orders
// folded from the log.
func TestMain_RebuildResumesAfterKill(t *testing.T) {
	const token = "test-admin-token"
	a := runMainDir(t, t.TempDir(), func(c *Config) {
		c.Roles = "api,relay,projector"
		c.HTTP.AdminToken = token
		c.Jobs.Settle = 200 * time.Millisecond
		c.Jobs.Grace = time.Second
	})
	ctx := t.Context()
	began := time.Now()

	// The orders: written through the command service on the same store.
	db := a.mongo.Database(a.Config.Mongo.Database)
	cache, err := lru.New[string, domain.Order](1000)
	if err != nil {
		t.Fatal(err)
	}
	svc := domain.NewService(mongodb.NewEventStore(db), cache)
	const orders = 160
	var ids []string
	for i := range orders {
		id := fmt.Sprintf("kill-%03d", i)
		ids = append(ids, id)
		cmds := []domain.Command{
			domain.PlaceOrder{CustomerID: fmt.Sprintf("cust-%d", i%7), Currency: "BRL",
				Items: []domain.Line{{SKU: "sku-1", Quantity: 1 + int64(i%3), UnitPriceCents: 1990}}},
			domain.Approve{}, domain.Ship{}, domain.Deliver{},
		}
		for _, c := range cmds[:1+i%4] {
			if _, err := svc.Execute(ctx, id, c, domain.ExecOptions{}); err != nil {
				t.Fatalf("%s: %T: %v", id, c, err)
			}
		}
	}
	t.Logf("%d orders written in %v", orders, time.Since(began).Round(time.Millisecond))
	var events int64
	for i := range orders {
		events += int64(1 + i%4)
	}

	jobsFlags := func(id string) []string {
		// Every role listens (health, readiness, metrics): port 0, so
		// B and C never clash with each other or anything on 8080.
		return []string{"-roles", "jobs", "-instance-id", id, "-http-addr", "127.0.0.1:0", "-mongodb-uri", a.Config.Mongo.URI, "-nats-url", a.Config.NATS.URL,
			"-job-lease-ttl", "3s", "-rebuild-batch-streams", "10", "-rebuild-max-events-per-second", "80",
			"-rebuild-settle", "200ms", "-rebuild-grace", "1s", "-log-level", "info"}
	}
	b := startInstance(t, "instance B", jobsFlags("instance-B")...)

	c := newClient(t, a)
	auth := []string{"Authorization", "Bearer " + token}
	r := c.must(202, "POST", "/v1/admin/projections/order_summaries/rebuilds", "", auth...)
	var job jobs.Job
	r.decode(t, &job)
	path := "/v1/admin/projections/order_summaries/rebuilds/" + job.ID

	get := func() jobs.Job {
		var j jobs.Job
		c.must(200, "GET", path, "", auth...).decode(t, &j)
		return j
	}
	// Halfway: B holds the partition and has checkpointed half the streams.
	var atKill jobs.Task
	deadline := time.Now().Add(60 * time.Second)
	for {
		j := get()
		if p, _ := j.Task("part-0"); p.Owner == "instance-B" && p.Streams >= orders/2 {
			atKill = p
			break
		}
		if j.State.Final() || time.Now().After(deadline) {
			t.Fatalf("the rebuild never got halfway in instance B: %+v", j)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.kill()
	killed, _ := get().Task("part-0")
	if killed.Streams >= orders {
		t.Fatalf("the partition finished before the kill: %+v", killed)
	}
	t.Logf("at %v: killed instance B with %d of %d streams checkpointed (cursor %s)", time.Since(began).Round(time.Millisecond), killed.Streams, orders, killed.Cursor)

	startInstance(t, "instance C", jobsFlags("instance-C")...)
	var done jobs.Job
	if !waitFor(90*time.Second, 200*time.Millisecond, func() bool { done = get(); return done.State.Final() }) {
		t.Fatalf("the rebuild did not finish after the takeover: %+v", done)
	}
	if done.State != jobs.StateSucceeded {
		t.Fatalf("rebuild %s: %s", done.State, done.Error)
	}
	t.Logf("at %v: the rebuild succeeded", time.Since(began).Round(time.Millisecond))
	// C resumes from B's last checkpoint. On a loaded machine a runner
	// can lose its lease (a renewal slower than the lease fences it) and
	// claim the task again: B before its first checkpoint starts afresh
	// (no resume), any later claim resumes at or after the previous one.
	p, _ := done.Task("part-0")
	firstC := slices.IndexFunc(p.Resumes, func(r jobs.Resume) bool { return r.Owner == "instance-C" })
	if firstC < 0 || p.Attempts < 1+len(p.Resumes) || p.Owner != "instance-C" {
		t.Fatalf("partition: owner %s, %d claims, resumes %+v; want instance-C after a resume, a claim for each resume", p.Owner, p.Attempts, p.Resumes)
	}
	if res := p.Resumes[firstC]; res.Streams < atKill.Streams || res.Streams != killed.Streams || res.Cursor != killed.Cursor {
		t.Errorf("resume %+v does not start from the dead runner's checkpoint (%d streams, cursor %s)", res, killed.Streams, killed.Cursor)
	}
	for i := 1; i < len(p.Resumes); i++ {
		prev, res := p.Resumes[i-1], p.Resumes[i]
		if (i > firstC && res.Owner != "instance-C") || res.Streams < prev.Streams || res.Cursor < prev.Cursor {
			t.Errorf("resume %d %+v goes back from resume %d %+v", i, res, i-1, prev)
		}
	}
	if p.Streams != orders || p.Events != events || done.Streams != orders {
		t.Errorf("the rebuild counted %d streams and %d events, want %d and %d: each stream exactly once", p.Streams, p.Events, orders, events)
	}
	if finish := done.Tasks[len(done.Tasks)-1]; finish.Owner != "instance-C" {
		t.Errorf("finish task run by %q, want instance-C", finish.Owner)
	}

	var status struct {
		Projections []jobs.ProjectionStatus `json:"projections"`
	}
	c.must(200, "GET", "/v1/admin/projections", "", auth...).decode(t, &status)
	for _, ps := range status.Projections {
		if ps.Name == "order_summaries" && ps.ActiveCollection != done.Shadow {
			t.Errorf("order_summaries reads %s, want the rebuilt %s", ps.ActiveCollection, done.Shadow)
		}
	}
	// The rebuilt read model equals the fold of the log: a verify job
	// reports no drift, and a sample read over REST agrees.
	r = c.must(202, "POST", "/v1/admin/projections/order_summaries/verifications", `{"repair":false}`, auth...)
	var verify jobs.Job
	r.decode(t, &verify)
	deadline = time.Now().Add(60 * time.Second)
	for !verify.State.Final() {
		if time.Now().After(deadline) {
			t.Fatalf("verify did not finish: %+v", verify)
		}
		time.Sleep(200 * time.Millisecond)
		c.must(200, "GET", "/v1/admin/projections/order_summaries/verifications/"+verify.ID, "", auth...).decode(t, &verify)
	}
	if rep := verify.Report; verify.State != jobs.StateSucceeded || rep == nil || rep.Drift() != 0 ||
		rep.Digest != rep.ExpectedDigest || rep.Documents != orders || rep.Collection != done.Shadow {
		t.Errorf("verify after the rebuild: %s %+v", verify.State, verify.Report)
	}
	for i := 0; i < len(ids); i += 10 {
		id := ids[i]
		var o domain.Order
		c.must(200, "GET", "/v1/orders/"+id, "").decode(t, &o)
		got := c.must(200, "GET", fmt.Sprintf("/v1/order-summaries/%s?min_version=%d", id, o.Version), "")
		if got.Header.Get("X-Read-Model-Stale") == "true" {
			t.Fatalf("summary %s did not reach v%d", id, o.Version)
		}
		var s domain.Order
		got.decode(t, &s)
		want, _ := json.Marshal(o)
		have, _ := json.Marshal(s)
		if !bytes.Equal(want, have) {
			t.Errorf("summary %s differs from the fold of the log:\n got %s\nwant %s", id, have, want)
		}
	}
}
