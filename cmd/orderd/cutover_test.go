package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// summariesNext is order_summaries at its next version: the same fold,
// with the currency stored in lower case, so that a reader can tell which
// version's document it got.
func summariesNext() *projection.Definition[domain.Order] {
	def := projection.OrderSummaries
	def.Version = def.Ver() + 1
	def.Apply = func(o *domain.Order, e domain.Event) error {
		if err := o.Apply(e); err != nil {
			return err
		}
		o.Currency = strings.ToLower(o.Currency)
		return nil
	}
	return &def
}

// versionRead is one read of an order summary: from which instance, and
// the version of the definition that wrote the document (0: not a 200).
type versionRead struct {
	instance string
	version  int
	status   int
}

// TestVersionedProjectionCutover plays a rolling upgrade: instance A runs
// order_summaries at its current version (old) and keeps taking commands;
// instance B starts with the definition at the next version (next) on the
// same store and NATS. B builds next from the log beside old, verifies it and
// switches readers to it; an operator then switches back. Throughout,
// readers on both instances get 200 with a document of one version,
// each instance's readers switch once each way (the pointer never
// flaps), the build is verified before the switch, and old, fed by
// A all along, is current again after the switch back.
func TestVersionedProjectionCutover(t *testing.T) {
	const token = "cutover-admin-token"
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	n := storetest.StartNATS(t) // before the instances: its cleanup runs after they closed
	start := func(id string, def *projection.Definition[domain.Order]) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Mongo.URI, c.Mongo.Database, c.NATS.URL, c.InstanceID = storeURI, db.Name(), n.URL, id
			c.HTTP.AdminToken = token
			c.Jobs.Settle, c.Jobs.Grace = 200*time.Millisecond, 10*time.Minute
			c.summaries = def
		})
	}
	auth := []string{"Authorization", "Bearer " + token}
	old, next := projection.OrderSummaries.Ver(), summariesNext().Ver()
	a := start("cutover-old", nil)
	ca := newClient(t, a)
	const orders = 24
	ids := make([]string, orders)
	versions := make([]int64, orders)
	for i := range ids {
		ids[i] = fmt.Sprintf("cut-%02d", i)
		versions[i] = ca.place(ids[i], fmt.Sprintf("cust-%d", i%5), 1+int64(i%3), 1000, 100).Version
		if i%2 == 0 {
			versions[i] = ca.step(ids[i], "approve").Version
		}
	}
	for i, id := range ids {
		ca.summaryEqualsOrder(id, versions[i])
	}
	status := func(c *client) jobs.ProjectionStatus {
		var body struct {
			Projections []jobs.ProjectionStatus `json:"projections"`
		}
		c.must(http.StatusOK, "GET", "/v1/admin/projections", "", auth...).decode(t, &body)
		for _, p := range body.Projections {
			if p.Name == "order_summaries" {
				return p
			}
		}
		t.Fatalf("no order_summaries in %+v", body.Projections)
		return jobs.ProjectionStatus{}
	}
	if st := status(ca); st.ActiveVersion != old || st.Version != old {
		t.Fatalf("before the upgrade: %+v; want version %d active", st, old)
	}

	// Readers on every instance, and commands on A, all along.
	var (
		mu      sync.Mutex
		reads   []versionRead
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		clients sync.Map // instance name -> *client
		mixed   atomic.Int64
	)
	clients.Store("A", ca)
	read := func(name string, c *client, i int) {
		r := c.do("GET", "/v1/order-summaries/"+ids[i%orders], "")
		rec := versionRead{instance: name, status: r.Status}
		if r.Status == http.StatusOK {
			var o domain.Order
			r.decode(t, &o)
			rec.version = map[bool]int{true: next, false: old}[o.Currency == "brl"]
		}
		// A list answer holds documents of one version only.
		l := c.do("GET", "/v1/order-summaries?limit=50", "")
		if l.Status == http.StatusOK {
			var page struct{ Items []domain.Order }
			l.decode(t, &page)
			lower, upper := 0, 0
			for _, o := range page.Items {
				if o.Currency == "brl" {
					lower++
				} else {
					upper++
				}
			}
			if lower > 0 && upper > 0 {
				mixed.Add(1)
			}
		}
		mu.Lock()
		reads = append(reads, rec)
		mu.Unlock()
	}
	for _, name := range []string{"A", "B"} {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if c, ok := clients.Load(name); ok {
					read(name, c.(*client), i)
				}
				// A steady trickle: the instances share one store
				// with the build.
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	var commands atomic.Int64
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("cut-live-%03d", i)
			ca.place(id, "cust-live", 1, 500, 0)
			ca.step(id, "approve")
			commands.Add(2)
			time.Sleep(50 * time.Millisecond)
		}
	})
	stopAll := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopAll()

	// The upgrade: B folds the next version, builds it and switches to it.
	b := start("cutover-next", summariesNext())
	cb := newClient(t, b)
	clients.Store("B", cb)
	var st jobs.ProjectionStatus
	// The finish switches the pointer, then records the job's success.
	if !waitFor(120*time.Second, 200*time.Millisecond, func() bool {
		st = status(cb)
		return st.ActiveVersion == next && st.LastRebuild != nil && st.LastRebuild.State == jobs.StateSucceeded
	}) {
		t.Fatalf("version %d not switched to, or its build not finished: %+v", next, st)
	}
	if st.Version != next || st.PreviousVersion != old || st.PreviousCollection != "order_summaries" || st.LastRebuild == nil {
		t.Errorf("after the cutover: %+v; want version %d active, order_summaries at version %d kept as previous", st, next, old)
	}
	var build jobs.Job
	cb.must(http.StatusOK, "GET", "/v1/admin/projections/order_summaries/rebuilds/"+st.LastRebuild.Job, "", auth...).decode(t, &build)
	if build.State != jobs.StateSucceeded || build.Version != next || build.Report == nil || build.Replaced != "order_summaries" {
		t.Fatalf("the build: %+v; want a succeeded rebuild of version %d with the verify report of its shadow", build, next)
	}
	if rep := build.Report; rep.Collection != build.Shadow || rep.Streams < orders || rep.Drift() != rep.Repaired {
		t.Errorf("verify before the switch: %+v; want the shadow checked against every stream, all its drift repaired", rep)
	}
	// An instance of the old version cannot verify the next one.
	if r := ca.do("POST", "/v1/admin/projections/order_summaries/verifications", `{}`, auth...); r.Status != http.StatusConflict ||
		!strings.Contains(string(r.Body), "/problems/projection-version") {
		t.Errorf("verify from the old version's instance: %v; want 409 /problems/projection-version", r)
	}
	verify := func(c *client) jobs.Job {
		t.Helper()
		var job jobs.Job
		c.must(http.StatusAccepted, "POST", "/v1/admin/projections/order_summaries/verifications", `{}`, auth...).decode(t, &job)
		if !waitFor(90*time.Second, 100*time.Millisecond, func() bool {
			c.must(http.StatusOK, "GET", "/v1/admin/projections/order_summaries/verifications/"+job.ID, "", auth...).decode(t, &job)
			return job.State.Final()
		}) || job.State != jobs.StateSucceeded || job.Report == nil {
			t.Fatalf("verify: %+v", job)
		}
		return job
	}
	// Readers see the next version within their instance's pointer cache age.
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lastOf(reads, "A") == next && lastOf(reads, "B") == next
	}) {
		t.Fatal("readers never got documents of the next version on both instances")
	}

	// The operator switches back, from the old instance.
	var back jobs.ProjectionStatus
	ca.must(http.StatusOK, "POST", "/v1/admin/projections/order_summaries/switch-back", "", auth...).decode(t, &back)
	if back.ActiveVersion != old || back.ActiveCollection != "order_summaries" || back.PreviousVersion != next || back.SwitchedBackFrom != next {
		t.Errorf("after the switch back: %+v; want order_summaries at version %d active, %d kept and switched back from", back, old, next)
	}
	switchedBack := time.Now()
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lastOf(reads, "A") == old && lastOf(reads, "B") == old
	}) {
		t.Fatal("readers did not get documents of the old version after the switch back")
	}
	stopAll()
	// The old version, fed by A through the whole upgrade, equals the log once
	// A's projector has caught up.
	if !waitFor(60*time.Second, 100*time.Millisecond, func() bool {
		lag := status(ca).ConsumerLag
		return lag != nil && *lag == 0
	}) {
		t.Fatalf("the old version's projector on A did not catch up: %+v", status(ca))
	}
	if rep := verify(ca).Report; rep.Drift() != 0 {
		t.Errorf("the old version after the switch back differs from the log: %+v", rep)
	}
	// B does not build the next version again: it was switched back from.
	if st := status(cb); st.ActiveVersion != old || st.ShadowCollection != "" || st.LastRebuild == nil || st.LastRebuild.Job != build.ID {
		t.Errorf("after the switch back and a verify: %+v; want version %d active and no new build", st, old)
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d reads, %d commands during the upgrade; switched back %v ago", len(reads), commands.Load(), time.Since(switchedBack).Round(time.Millisecond))
	for _, name := range []string{"A", "B"} {
		var seq []int
		for _, r := range reads {
			if r.instance != name {
				continue
			}
			if r.status != http.StatusOK {
				t.Errorf("a reader on %s got %d", name, r.status)
				continue
			}
			if len(seq) == 0 || seq[len(seq)-1] != r.version {
				seq = append(seq, r.version)
			}
		}
		// A: old, next, old. B starts while old is active: the same or,
		// when its first read came after the switch, next, old.
		if want := []int{old, next, old}; fmt.Sprint(seq) != fmt.Sprint(want) && (name == "A" || fmt.Sprint(seq) != fmt.Sprint(want[1:])) {
			t.Errorf("versions read on %s, in order: %v; want %v (one switch each way)", name, seq, want)
		}
	}
	if m := mixed.Load(); m > 0 {
		t.Errorf("%d list answers held documents of both versions", m)
	}
}

// lastOf is the version of instance's last read, 0 when none.
func lastOf(reads []versionRead, instance string) int {
	for i := len(reads) - 1; i >= 0; i-- {
		if reads[i].instance == instance {
			return reads[i].version
		}
	}
	return 0
}
