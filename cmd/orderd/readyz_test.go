package main

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/mongodb/storetest"
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
// naming the bus while NATS is down.
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
	both := map[string]string{"store": "ok", "bus": "ok"}
	busDown := map[string]string{"store": "ok", "bus": "unavailable"}
	want := map[string]map[string]string{"api": storeOnly, "relay": both, "projector": both, "jobs": both, "api,relay": both}
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
