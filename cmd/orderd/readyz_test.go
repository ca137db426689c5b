package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// readyz answers GET /readyz of m: its status and checks.
func readyz(t *testing.T, m *Main) (int, map[string]string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + m.HTTPAddr + "/readyz")
	if err != nil {
		return 0, map[string]string{"error": err.Error()}
	}
	defer resp.Body.Close()
	var body map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/readyz of %s: %v", m.Config.Roles, err)
	}
	return resp.StatusCode, body
}

// waitReadyz waits until /readyz of m answers code with exactly checks.
func waitReadyz(t *testing.T, m *Main, code int, checks map[string]string) {
	t.Helper()
	var got int
	var body map[string]string
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		got, body = readyz(t, m)
		return got == code && maps.Equal(body, checks)
	}) {
		t.Fatalf("roles %s: /readyz answers %d %v; want %d %v", m.Config.Roles, got, body, code, checks)
	}
}

// TestReadyzPerRole: /readyz checks what each role needs, the union for a
// process with several. The api role needs only the store (its appends
// reach NATS through the relay, which tails the log), so an api-only
// instance stays ready while NATS is down and keeps taking commands, and
// starts and is ready with NATS unreachable or not configured at all;
// relay, projector and jobs need the store and the bus, and answer 503
// naming the bus while NATS is down; each of them is a check of its own
// too (TestReadyzNamesFailingRole).
func TestReadyzPerRole(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	ns, err := embedded.StartNATS(t.TempDir(), "127.0.0.1", -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown) // registered before the instances: runs after they closed
	natsURL := ns.ClientURL()
	start := func(roles, natsURL string) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Roles, c.Mongo.URI, c.Mongo.Database, c.NATS.URL = roles, storeURI, db.Name(), natsURL
			c.InstanceID = "readyz-" + strings.ReplaceAll(roles, ",", "-")
		})
	}

	storeOnly := map[string]string{"store": "ok"}
	// both is the store, the bus and role, which is ready while it runs.
	both := func(role string) map[string]string { return map[string]string{"store": "ok", "bus": "ok", role: "ok"} }
	want := map[string]map[string]string{"api": storeOnly, "relay": both("relay"), "projector": both("projector"),
		"jobs": both("jobs"), "api,relay": both("relay")}
	instances := map[string]*Main{}
	for roles := range want {
		instances[roles] = start(roles, natsURL)
	}
	for roles, checks := range want {
		waitReadyz(t, instances[roles], http.StatusOK, checks)
	}

	ns.Shutdown()
	ns.WaitForShutdown()
	for roles, checks := range want {
		if maps.Equal(checks, storeOnly) {
			waitReadyz(t, instances[roles], http.StatusOK, storeOnly)
		} else {
			busDown := maps.Clone(checks)
			busDown["bus"] = "unavailable"
			waitReadyz(t, instances[roles], http.StatusServiceUnavailable, busDown)
		}
	}
	// The answer of an api-only instance is no stale one: NATS is down
	// for the others, and it still takes commands.
	if code, body := readyz(t, instances["api"]); code != http.StatusOK || !maps.Equal(body, storeOnly) {
		t.Errorf("api with NATS down: /readyz %d %v; want 200 %v", code, body, storeOnly)
	}
	newClient(t, instances["api"]).place("readyz-1", "cust-r", 1, 990, 0)

	// Started while NATS is unreachable, and with no NATS configured.
	down := start("api", natsURL)
	waitReadyz(t, down, http.StatusOK, storeOnly)
	newClient(t, down).place("readyz-2", "cust-r", 1, 990, 0)
	none := start("api", "")
	if none.nc != nil || none.Config.NATS.URL != "" {
		t.Errorf("api without NATS_URL connected to NATS at %q: the embedded NATS started for a role that needs none", none.Config.NATS.URL)
	}
	waitReadyz(t, none, http.StatusOK, storeOnly)
	newClient(t, none).place("readyz-3", "cust-r", 1, 990, 0)
}

// TestReadyzNamesFailingRole: a role that keeps stopping is not ready.
// The fault is a real one: a consumer of order_summaries' first partition
// made beforehand with settings JetStream cannot update (no acks), so the
// projector's runner of order_summaries fails at each start and is
// restarted; /readyz answers 503 naming the projector and
// orderd_role_failing says which projection. Once the consumer is gone
// the runner starts, and after a healthy run readiness recovers.
func TestReadyzNamesFailingRole(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	ns, err := embedded.StartNATS(t.TempDir(), "127.0.0.1", -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown) // registered before the instance: runs after it closed
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := DefaultConfig()
	stream := c.Stream
	stream.Partitions = c.Projector.Partitions
	if err := bus.EnsureStream(ctx, js, stream); err != nil {
		t.Fatal(err)
	}
	durable := fmt.Sprintf("proj_%s_p00", projection.OrderSummaries.Key())
	if _, err := js.CreateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{Durable: durable,
		FilterSubject: stream.SubjectPrefix + ".0.>", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}

	m := runMainDir(t, t.TempDir(), func(c *Config) {
		c.Roles, c.Mongo.URI, c.Mongo.Database, c.NATS.URL = "projector", storeURI, db.Name(), ns.ClientURL()
	})
	series := `orderd_role_failing{projection="order_summaries",role="projector"}`
	failing := func() float64 {
		return scrapeMetrics(ctx, http.DefaultClient, "http://"+m.HTTPAddr)[series]
	}
	// Five stops at once take about 1.5 s of restart delays.
	waitReadyz(t, m, http.StatusServiceUnavailable, map[string]string{"store": "ok", "bus": "ok", "projector": "unavailable"})
	if v := failing(); v != 1 {
		t.Errorf("%s = %v while /readyz names the projector; want 1", series, v)
	}

	if err := js.DeleteConsumer(ctx, stream.Name, durable); err != nil {
		t.Fatal(err)
	}
	// The next restart (at most 10 s away) creates the consumer; a run
	// of healthyRun makes the role ready again.
	ready := map[string]string{"store": "ok", "bus": "ok", "projector": "ok"}
	var code int
	var body map[string]string
	if !waitFor(2*(10*time.Second+healthyRun), 100*time.Millisecond, func() bool {
		code, body = readyz(t, m)
		return code == http.StatusOK && maps.Equal(body, ready)
	}) {
		t.Fatalf("after the fault was removed: /readyz answers %d %v; want 200 %v", code, body, ready)
	}
	if v := failing(); v != 0 {
		t.Errorf("%s = %v once ready again; want 0", series, v)
	}
}
