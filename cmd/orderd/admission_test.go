package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// TestCommandsPausedWhileReadModelsAreBehind: an API instance refuses
// commands with 503 /problems/read-models-behind and a Retry-After while
// the projections' consumers hold more than ORDERD_MAX_LAG unacknowledged
// events, runs none of them (the log does not grow), still answers bad
// input as such, and takes commands again once a projector has caught
// up.
func TestCommandsPausedWhileReadModelsAreBehind(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	n := storetest.StartNATS(t) // before the instances: its cleanup runs after they closed
	const maxLag = 6
	start := func(id, roles string) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Roles, c.Mongo.URI, c.Mongo.Database, c.NATS.URL = roles, storeURI, db.Name(), n.URL
			c.InstanceID, c.MaxLag = id, maxLag
		})
	}
	// A first instance with every role creates the projections' durable
	// consumers; they stay when it stops, and count what nobody applies.
	all := start("admission-all", "all")
	want := all.Config.Projector.Partitions + 1 // the summaries' partitions and the daily sales rollup's one
	consumers := 0
	if !waitFor(60*time.Second, 50*time.Millisecond, func() bool {
		consumers = 0
		if st, err := n.JS.Stream(t.Context(), all.Config.Stream.Name); err == nil {
			names := st.ConsumerNames(t.Context())
			for range names.Name() {
				consumers++
			}
		}
		return consumers == want
	}) {
		t.Fatalf("%d consumers on the stream; want %d", consumers, want)
	}
	closeMain(t, all)
	api := start("admission-api", "api,relay")
	c := newClient(t, api)

	var refused response
	placed := 0
	if !waitFor(60*time.Second, 10*time.Millisecond, func() bool {
		r := c.do("POST", "/v1/orders", fmt.Sprintf(`{"order_id":"adm-%d","customer_id":"c1","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":100}]}`, placed))
		switch r.Status {
		case http.StatusCreated:
			placed++
			return false
		case http.StatusServiceUnavailable:
			refused = r
			return true
		}
		t.Fatalf("place order: %v", r)
		return false
	}) {
		t.Fatalf("%d orders placed with no projector running and max lag %d, none refused", placed, maxLag)
	}
	if placed <= maxLag {
		t.Errorf("refused after %d orders, at most %d events behind; want more than %d", placed, placed, maxLag)
	}
	var p struct{ Type, Detail string }
	refused.decode(t, &p)
	secs, err := strconv.Atoi(refused.Header.Get("Retry-After"))
	if p.Type != "/problems/read-models-behind" || err != nil || secs < 1 || secs > 30 || !strings.Contains(p.Detail, "events behind") {
		t.Errorf("refused command: %v, Retry-After %q; want /problems/read-models-behind naming the lag and Retry-After 1-30 s", refused, refused.Header.Get("Retry-After"))
	}
	// Nothing refused reached the log; bad input is still answered as such.
	logged, err := db.Collection(mongodb.CommitsCollection).CountDocuments(t.Context(), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if logged != int64(placed) {
		t.Errorf("%d commits in the log after %d orders were placed and one refused", logged, placed)
	}
	c.must(http.StatusUnprocessableEntity, "POST", "/v1/orders", `{"customer_id":"c1","currency":"BRL","items":[]}`)
	if got := c.must(http.StatusServiceUnavailable, "POST", "/v1/orders/adm-0/approve", ""); !strings.Contains(string(got.Body), "read-models-behind") {
		t.Errorf("approve while behind: %v", got)
	}
	if n := metric(t, c, `orderd_commands_total{command="approve",outcome="read-models-behind"}`); n < 1 {
		t.Errorf("refusals counted: %v; want at least 1", n)
	}

	// A projector catches up; commands are taken again.
	start("admission-projector", "projector")
	var last response
	if !waitFor(60*time.Second, 50*time.Millisecond, func() bool {
		last = c.do("POST", "/v1/orders/adm-0/approve", "")
		return last.Status == http.StatusOK
	}) {
		t.Fatalf("approve after a projector started: %v; want 200 once the read models caught up", last)
	}
	if n := metric(t, c, "orderd_admission_projection_lag"); n < 0 || n > maxLag {
		t.Errorf("orderd_admission_projection_lag %v after the catch-up; want 0-%d", n, maxLag)
	}
}

// metric returns the value of the sample named series (name with its
// labels, as /metrics prints it), failing the test when it is missing.
func metric(t *testing.T, c *client, series string) float64 {
	t.Helper()
	r := c.must(http.StatusOK, "GET", "/metrics", "")
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", series, v)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// Without a fresh lag sample (NATS unreachable or electing) an API
// instance takes every command: the log is the buffer, and the relay
// publishes it once the bus answers. With one, it refuses only over the
// limit.
func TestAdmissionTakesCommandsWithoutALagSample(t *testing.T) {
	n := storetest.StartNATS(t)
	stream := storetest.NewStream(t, n, 0)
	db := storetest.Database(t)
	sums := mongodb.NewProjection(db, projection.OrderSummaries, mongodb.NewEventStore(db), nil, mongodb.NewPointers(db))
	runners := []*projector.Runner{projector.NewRunner(sums, n.JS, nil,
		projector.RunnerConfig{Stream: stream.Name, SubjectPrefix: stream.SubjectPrefix}, slog.New(slog.DiscardHandler), nil)}
	// place sends a command to an API whose commands are admitted by
	// watch, with a limit of 10 events.
	place := func(watch *projector.LagWatch, id string) *httptest.ResponseRecorder {
		srv := orderhttp.NewServer(orderhttp.Config{Commands: domain.NewService(domaintest.NewMemStore(), nil), Lag: watch, MaxLag: 10})
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(
			`{"order_id":"`+id+`","customer_id":"c1","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":100}]}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := place(projector.NewLagWatch(runners, time.Second, slog.New(slog.DiscardHandler)), "unread"); rec.Code != http.StatusCreated {
		t.Errorf("no lag sample: %d %s; want taken", rec.Code, rec.Body)
	}
	watch := projector.NewLagWatch(runners, time.Second, slog.New(slog.DiscardHandler))
	projectiontest.Go(t, "lag watch", watch.Run)
	if !waitFor(10*time.Second, 10*time.Millisecond, func() bool { _, _, _, fresh := watch.Latest(); return fresh }) {
		t.Fatal("no fresh lag sample within 10s")
	}
	if rec := place(watch, "fresh"); rec.Code != http.StatusCreated {
		t.Errorf("a fresh sample of no lag: %d %s; want taken", rec.Code, rec.Body)
	}
}
