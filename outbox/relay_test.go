package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/internal/freeport"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/outbox"
)

// The MongoDB adapter's lease is the one the sweeper runs under.
var _ outbox.Lease = (*mongodb.Lease)(nil)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// openOutbox is the set-up of an outbox test: an event store on a fresh
// database (storetest.OpenStore), a NATS server (storetest.StartNATS) and
// a stream on it.
func openOutbox(t testing.TB) (*mongodb.EventStore, *mongo.Database, *storetest.NATS, bus.StreamConfig) {
	t.Helper()
	s, db := storetest.OpenStore(t)
	n := storetest.StartNATS(t)
	return s, db, n, storetest.NewStream(t, n)
}

// appendCommits appends commits to a few fresh streams, 1 to 3 events each,
// and returns the stored events (as Load returns them) in append order.
func appendCommits(t *testing.T, s *mongodb.EventStore, streams, perStream int, after ...func()) []domain.Event {
	t.Helper()
	ids := make([]string, streams)
	heads := make([]int64, streams)
	for i := range ids {
		ids[i] = storetest.Unique("order-")
	}
	var out []domain.Event
	for k := range streams * perStream {
		i := k % streams
		data := []domain.EventData{domain.OrderCanceled{Reason: fmt.Sprintf("commit %d", k)}}
		for range k % 3 {
			data = append(data, domain.OrderApproved{})
		}
		c := storetest.NewCommit(ids[i], heads[i], data...)
		at, err := s.Append(t.Context(), c)
		if err != nil {
			t.Fatalf("append %s at v%d: %v", c.StreamID, c.ExpectedVersion, err)
		}
		heads[i] = c.LastVersion()
		for _, f := range after {
			f()
		}
		for _, e := range c.Events {
			e.RecordedAt = at
			out = append(out, e)
		}
	}
	return out
}

// stream reads the JetStream stream name and its state.
func stream(t *testing.T, js jetstream.JetStream, name string) (jetstream.Stream, *jetstream.StreamInfo) {
	t.Helper()
	st, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return st, info
}

// streamMessages reads every message of the JetStream stream by sequence.
func streamMessages(t *testing.T, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	st, info := stream(t, js, name)
	var out []*jetstream.RawStreamMsg
	if info.State.Msgs == 0 {
		return out
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("stream %s seq %d: %v", name, seq, err)
		}
		out = append(out, m)
	}
	return out
}

func streamCount(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	_, info := stream(t, js, name)
	return info.State.Msgs
}

// checkPublishedOnce asserts that the stream holds exactly the events of
// want, each once, on its stream's subject with Nats-Msg-Id = event id and
// the event as its body, each stream's events in version order.
func checkPublishedOnce(t *testing.T, n *storetest.NATS, cfg bus.StreamConfig, want []domain.Event) {
	t.Helper()
	msgs := streamMessages(t, n.JS, cfg.Name)
	if len(msgs) != len(want) {
		t.Errorf("stream %s holds %d messages, want %d", cfg.Name, len(msgs), len(want))
	}
	byID := make(map[string]*jetstream.RawStreamMsg, len(msgs))
	last := map[string]int64{}
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if byID[id] != nil {
			t.Errorf("event %s published twice (seq %d and %d)", id, byID[id].Sequence, m.Sequence)
		}
		byID[id] = m
		e, err := domain.UnmarshalEvent(m.Data)
		if err != nil {
			t.Errorf("seq %d: %v", m.Sequence, err)
			continue
		}
		if e.ID != id {
			t.Errorf("seq %d: Nats-Msg-Id %q, body event %q", m.Sequence, id, e.ID)
		}
		if e.Version <= last[e.StreamID] {
			t.Errorf("seq %d: %s v%d after v%d", m.Sequence, e.StreamID, e.Version, last[e.StreamID])
		}
		last[e.StreamID] = e.Version
	}
	for _, w := range want {
		m := byID[w.ID]
		if m == nil {
			t.Errorf("event %s (%s v%d) was not published", w.ID, w.StreamID, w.Version)
			continue
		}
		subject := cfg.Subject(w.StreamID)
		if n.Server != nil && subject != "orders.events."+w.StreamID {
			t.Errorf("subject %q, want orders.events.%s", subject, w.StreamID)
		}
		if m.Subject != subject {
			t.Errorf("event %s on subject %q, want %q", w.ID, m.Subject, subject)
		}
		got, err := domain.UnmarshalEvent(m.Data)
		if err != nil {
			continue
		}
		if d := storetest.DiffEvents([]domain.Event{w}, []domain.Event{got}); d != "" {
			t.Errorf("published %s: %s", w.ID, d)
		}
	}
}

// markers counts the commits by their published marker and checks that the
// published ones carry published_at.
func markers(t *testing.T, db *mongo.Database) (published, unpublished int64) {
	t.Helper()
	coll := db.Collection(mongodb.CommitsCollection)
	cur, err := coll.Find(t.Context(), bson.D{})
	if err != nil {
		t.Fatalf("read commits: %v", err)
	}
	var docs []struct {
		Published   bool       `bson:"published"`
		PublishedAt *time.Time `bson:"published_at"`
	}
	if err := cur.All(t.Context(), &docs); err != nil {
		t.Fatalf("read commits: %v", err)
	}
	for _, d := range docs {
		if d.Published {
			published++
			if d.PublishedAt == nil {
				t.Errorf("a published commit has no published_at")
			}
		} else {
			unpublished++
		}
	}
	return published, unpublished
}

// drain runs PublishPending until it finds nothing, at most rounds times,
// and returns what each round read.
func drain(t *testing.T, s *outbox.Sweeper, rounds int) []int {
	t.Helper()
	var got []int
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range rounds {
		k, err := s.PublishPending(ctx)
		if err != nil {
			t.Fatalf("publish round %d: %v", len(got), err)
		}
		got = append(got, k)
		if k == 0 {
			return got
		}
	}
	t.Fatalf("the outbox is not empty after %d rounds: %v", rounds, got)
	return nil
}

func wantBacklog(t *testing.T, s *mongodb.EventStore, want int64) {
	t.Helper()
	n, age, err := s.Unpublished(t.Context())
	if err != nil || n != want || (want == 0) != (age == 0) || age < 0 {
		t.Errorf("backlog: %d commits, oldest %v, %v; want %d", n, age, err, want)
	}
}

// waitBacklog waits until the log holds want unpublished commits.
func waitBacklog(t *testing.T, s *mongodb.EventStore, within time.Duration, want int64) {
	t.Helper()
	storetest.WaitFor(t, within, fmt.Sprintf("%d unpublished commits", want), func() bool {
		n, _, err := s.Unpublished(t.Context())
		return err == nil && n == want
	})
}

// goRun runs run (a Relay's or a Sweeper's Run) until the returned stop is
// called (also in cleanup); stop waits for run to return and fails the
// test if it takes over 10s or returns an error.
func goRun(t *testing.T, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("run did not return within 10s of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// connectNATS opens a NATS connection of its own to url, as another
// process would, closed in cleanup.
func connectNATS(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// instance is one API instance's view of the outbox: a Store whose append
// hook feeds its Relay, and a Sweeper, each with metrics of its own.
type instance struct {
	store              *mongodb.EventStore
	relay              *outbox.Relay
	sweeper            *outbox.Sweeper
	relayReg, sweepReg *prometheus.Registry
}

func newInstance(t testing.TB, db *mongo.Database, js jetstream.JetStream, stream bus.StreamConfig, cfg outbox.Config) *instance {
	t.Helper()
	in := &instance{relayReg: prometheus.NewRegistry(), sweepReg: prometheus.NewRegistry()}
	in.relay = outbox.NewRelay(mongodb.NewEventStore(db), bus.NewPublisher(js, stream), cfg, testLogger(t), outbox.NewMetrics(in.relayReg))
	in.sweeper = newSweeper(t, db, js, stream, cfg, outbox.NewMetrics(in.sweepReg))
	in.store = mongodb.NewEventStore(db, mongodb.WithAppendHook(in.relay.Appended))
	return in
}

// newSweeper returns the Sweeper of instance cfg.Owner, on db's event log,
// publishing to stream through js, under a sweep lease of cfg.LeaseTTL.
func newSweeper(t testing.TB, db *mongo.Database, js jetstream.JetStream, stream bus.StreamConfig, cfg outbox.Config, m *outbox.Metrics) *outbox.Sweeper {
	ttl := cfg.LeaseTTL
	if ttl == 0 {
		ttl = outbox.DefaultLeaseTTL
	}
	lease := mongodb.NewLease(db, outbox.SweepLease, cfg.Owner, ttl)
	return outbox.NewSweeper(mongodb.NewEventStore(db), bus.NewPublisher(js, stream), lease, cfg, testLogger(t), m)
}

// metric returns the value of the counter or gauge name in reg (0 when
// it has none).
func metric(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	return 0
}

func TestSweeperPublishPendingPublishesEachEventOnce(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	want := appendCommits(t, s, 3, 3) // 9 commits, no relay: all in the outbox
	sw := newSweeper(t, db, n.JS, cfg, outbox.Config{Owner: "r1", BatchSize: 4}, nil)
	wantBacklog(t, s, 9)

	// Each round takes a batch, oldest first; the last finds nothing.
	if rounds := drain(t, sw, 10); !slices.Equal(rounds, []int{4, 4, 1, 0}) {
		t.Errorf("rounds read %v commits, want [4 4 1 0]", rounds)
	}
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := markers(t, db); pub != 9 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 9, 0", pub, unpub)
	}
	wantBacklog(t, s, 0)

	// Later commits are published once too, and nothing earlier again.
	want = append(want, appendCommits(t, s, 2, 1)...)
	drain(t, sw, 3)
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := markers(t, db); pub != 11 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 11, 0", pub, unpub)
	}
}

// The Relay publishes what its Store appends, through the append hook
// alone (no sweep runs), and marks each commit in the same round.
func TestRelayPublishesOwnAppends(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	in := newInstance(t, db, n.JS, cfg, outbox.Config{Owner: "api-1"})
	stop := goRun(t, in.relay.Run)

	start := time.Now()
	want := appendCommits(t, in.store, 10, 5) // 50 commits
	storetest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d events in the stream", len(want)), func() bool {
		return streamCount(t, n.JS, cfg.Name) >= uint64(len(want))
	})
	published := time.Now()
	waitBacklog(t, in.store, 10*time.Second, 0)
	t.Logf("all events in the stream %v after the first append; all marked %v later",
		published.Sub(start).Round(time.Millisecond), time.Since(published).Round(time.Millisecond))
	stop()
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := markers(t, db); pub != 50 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 50, 0", pub, unpub)
	}
	if got := metric(t, in.relayReg, "orderd_relay_published_events_total"); got != float64(len(want)) {
		t.Errorf("published events metric %v, want %d", got, len(want))
	}
}

// The append hook never blocks: with the Relay not running and its queue
// full, appends still return, and the commits that found no room are
// left to the sweep.
func TestRelayFullQueueLeavesCommitsToTheSweep(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	in := newInstance(t, db, n.JS, cfg, outbox.Config{Owner: "api-1", QueueSize: 2})
	want := appendCommits(t, in.store, 5, 1) // 5 commits, the Relay not running
	queued := 0                              // events of the first two commits, one stream each
	for _, e := range want {
		if e.StreamID == want[0].StreamID || e.StreamID == want[1].StreamID {
			queued++
		}
	}
	stop := goRun(t, in.relay.Run)
	storetest.WaitFor(t, 10*time.Second, "the 2 queued commits in the stream", func() bool {
		return streamCount(t, n.JS, cfg.Name) >= uint64(queued)
	})
	waitBacklog(t, in.store, 10*time.Second, 3)
	stop()
	if got := streamCount(t, n.JS, cfg.Name); got != uint64(queued) {
		t.Errorf("the relay published %d events, want the %d of the 2 commits its queue held", got, queued)
	}
	drain(t, in.sweeper, 3)
	checkPublishedOnce(t, n, cfg, want)
}

// On shutdown the Relay gives the commits still queued one last round,
// bounded by a short grace, instead of leaving them all to the sweep.
func TestRelayShutdownPublishesWhatIsQueued(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	in := newInstance(t, db, n.JS, cfg, outbox.Config{Owner: "api-1"})
	want := appendCommits(t, in.store, 3, 1) // queued; Run not started
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	if err := in.relay.Run(ctx); err != nil {
		t.Fatalf("run after cancellation: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the last round took %v", took)
	}
	checkPublishedOnce(t, n, cfg, want)
	wantBacklog(t, in.store, 0)
}

func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	in := newInstance(t, db, n.JS, cfg, outbox.Config{Owner: "api-1"})
	stop := goRun(t, in.relay.Run)
	want := appendCommits(t, in.store, 2, 3) // 6 commits
	waitBacklog(t, in.store, 10*time.Second, 0)
	stop()
	checkPublishedOnce(t, n, cfg, want)

	// The crash: the messages are in the stream, the marks are lost.
	res, err := db.Collection(mongodb.CommitsCollection).UpdateMany(t.Context(), bson.D{},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: false}}}, {Key: "$unset", Value: bson.D{{Key: "published_at", Value: ""}}}})
	if err != nil || res.ModifiedCount != 6 {
		t.Fatalf("reset marks: %+v, %v", res, err)
	}
	wantBacklog(t, in.store, 6)

	// A sweep publishes them again; JetStream drops the copies.
	sw := newSweeper(t, db, n.JS, cfg, outbox.Config{Owner: "api-2"}, nil)
	if rounds := drain(t, sw, 3); !slices.Equal(rounds, []int{6, 0}) {
		t.Errorf("rounds read %v commits, want [6 0]", rounds)
	}
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := markers(t, db); pub != 6 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 6, 0", pub, unpub)
	}
	wantBacklog(t, in.store, 0)
}

// restartableNATS starts an embedded NATS server that the test may stop
// and start again on the same port and store directory. connect opens a
// connection that reconnects for ever, every 20ms, closed in cleanup.
type restartableNATS struct {
	t    *testing.T
	dir  string
	port int
	srv  *server.Server
}

func newRestartableNATS(t *testing.T) *restartableNATS {
	// Always an embedded server, also with NATS_URL: the test stops it.
	r := &restartableNATS{t: t, dir: t.TempDir(), port: freeport.Port(t)}
	r.start()
	return r
}

func (r *restartableNATS) start() {
	ns, err := embedded.StartNATS(r.dir, "127.0.0.1", r.port)
	if err != nil {
		r.t.Fatalf("start nats on port %d: %v", r.port, err)
	}
	r.t.Cleanup(ns.Shutdown)
	r.srv = ns
}

func (r *restartableNATS) stop() {
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
}

func (r *restartableNATS) connect() *storetest.NATS {
	srv := r.srv.ClientURL()
	nc, js := connectNATS(r.t, srv)
	return &storetest.NATS{URL: srv, Conn: nc, JS: js, Server: r.srv}
}

// The Relay holds the appends of a NATS outage and publishes them itself
// once its connection is back, without a sweep: a failed round's commits
// are tried again, not left behind.
func TestRelayPublishesThroughAnOutage(t *testing.T) {
	ns := newRestartableNATS(t)
	_, db := storetest.OpenStore(t)
	n := ns.connect()
	cfg := storetest.NewStream(t, n)
	in := newInstance(t, db, n.JS, cfg, outbox.Config{Owner: "api-1", AckTimeout: 300 * time.Millisecond})
	goRun(t, in.relay.Run)
	want := appendCommits(t, in.store, 2, 1)
	waitBacklog(t, in.store, 10*time.Second, 0)

	ns.stop()
	down := appendCommits(t, in.store, 3, 2)
	want = append(want, down...)
	// Rounds fail while the server is away; the commits stay unpublished.
	storetest.WaitFor(t, 10*time.Second, "two failed publish rounds", func() bool { return metric(t, in.relayReg, "orderd_relay_publish_errors_total") >= 2 })
	if pub, unpub := markers(t, db); pub != 2 || unpub != 6 {
		t.Fatalf("with NATS down: %d commits published, %d not; want 2, 6", pub, unpub)
	}
	ns.start()
	waitBacklog(t, in.store, 20*time.Second, 0)
	checkPublishedOnce(t, n, cfg, want)
}

func TestRelayNATSDown(t *testing.T) {
	ns := newRestartableNATS(t)
	_, db := storetest.OpenStore(t)
	n := ns.connect()
	cfg := storetest.NewStream(t, n)
	rcfg := outbox.Config{Owner: "api-1", AckTimeout: 500 * time.Millisecond,
		SweepInterval: 50 * time.Millisecond, SweepGrace: time.Millisecond, LeaseTTL: time.Second}
	in := newInstance(t, db, n.JS, cfg, rcfg)
	stopRelay := goRun(t, in.relay.Run)
	want := appendCommits(t, in.store, 2, 1)
	waitBacklog(t, in.store, 10*time.Second, 0)

	ns.stop()
	// Commands do not need NATS: each append returns at once, its commit
	// queued for the relay, whose round fails and leaves it to the sweep.
	start := time.Now()
	down := appendCommits(t, in.store, 2, 2)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("4 appends with NATS down took %v", took)
	}
	want = append(want, down...)
	for i := range 2 {
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		k, err := in.sweeper.PublishPending(ctx)
		cancel()
		if err == nil || time.Since(start) > 5*time.Second {
			t.Fatalf("publish round %d with NATS down: read %d commits, %v after %v; want an error within the 500ms ack timeout",
				i, k, err, time.Since(start))
		}
		t.Logf("publish with NATS down: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	stopRelay()
	if pub, unpub := markers(t, db); pub != 2 || unpub != 4 {
		t.Errorf("%d commits published, %d not; want 2, 4", pub, unpub)
	}
	wantBacklog(t, in.store, 4)
	n.Conn.Close()

	// The same port and store: the stream and its de-duplication state
	// come back; a new connection's sweeper publishes the backlog.
	ns.start()
	n = ns.connect()
	if got := streamCount(t, n.JS, cfg.Name); got != uint64(len(want)-len(down)) {
		t.Fatalf("after the restart the stream holds %d messages, want %d", got, len(want)-len(down))
	}
	in = newInstance(t, db, n.JS, cfg, rcfg)
	stop := goRun(t, in.sweeper.Run)
	waitBacklog(t, in.store, 10*time.Second, 0)
	stop()
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := markers(t, db); pub != 6 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 6, 0", pub, unpub)
	}

	// The restarted server still remembers the message ids: republishing
	// everything (marks lost) adds nothing.
	if _, err := db.Collection(mongodb.CommitsCollection).UpdateMany(t.Context(), bson.D{},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: false}}}}); err != nil {
		t.Fatalf("reset marks: %v", err)
	}
	drain(t, in.sweeper, 3)
	checkPublishedOnce(t, n, cfg, want)
}

func TestSweeperWaitsForLease(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	holder := mongodb.NewLease(db, outbox.SweepLease, "other-instance", time.Minute)
	if ok, err := holder.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	sw := newSweeper(t, db, n.JS, cfg, outbox.Config{Owner: "r1",
		SweepInterval: 20 * time.Millisecond, SweepGrace: time.Millisecond, LeaseTTL: 300 * time.Millisecond}, nil)
	stop := goRun(t, sw.Run)
	want := appendCommits(t, s, 2, 2) // no relay: all left to the sweep

	// Several lease periods of the sweeper pass: it must not publish.
	time.Sleep(500 * time.Millisecond)
	if got := streamCount(t, n.JS, cfg.Name); got != 0 {
		t.Fatalf("the sweeper published %d messages while another instance held the lease", got)
	}
	wantBacklog(t, s, 4)

	if err := holder.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
	waitBacklog(t, s, 5*time.Second, 0)
	stop()
	checkPublishedOnce(t, n, cfg, want)
	// Run released its lease on the way out: another instance takes it at once.
	if ok, err := holder.TryAcquire(t.Context()); !ok || err != nil {
		t.Errorf("the old holder after the sweeper stopped: %v, %v; want the lease back", ok, err)
	}
}

// A Sweeper stopped at any moment, in the middle of a renewal too, gives
// its lease up: another instance claims it at once instead of after the
// TTL. The renewals come every 50 ms, so some of the 30 stops land in one.
func TestSweeperReleasesItsLeaseWheneverItStops(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	other := mongodb.NewLease(db, outbox.SweepLease, "other-instance", time.Minute)
	sw := newSweeper(t, db, n.JS, cfg, outbox.Config{Owner: "r1",
		SweepInterval: time.Millisecond, LeaseTTL: 150 * time.Millisecond}, nil)
	holder := func() string {
		var doc struct {
			Owner     string    `bson:"owner"`
			ExpiresAt time.Time `bson:"expires_at"`
		}
		err := db.Collection(mongodb.LeasesCollection).FindOne(t.Context(), bson.D{{Key: "_id", Value: outbox.SweepLease}}).Decode(&doc)
		if err != nil || !doc.ExpiresAt.After(time.Now()) {
			return ""
		}
		return doc.Owner
	}
	for i := range 30 {
		stop := goRun(t, sw.Run)
		storetest.WaitFor(t, 10*time.Second, "the sweeper to hold its lease", func() bool { return holder() == "r1" })
		time.Sleep(time.Duration(i%10) * 5 * time.Millisecond)
		stop()
		if ok, err := other.TryAcquire(t.Context()); !ok || err != nil {
			t.Fatalf("stop %d: another instance's claim after the sweeper stopped: %v, %v; want the lease", i, ok, err)
		}
		if err := other.Release(t.Context()); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
}

// Two API instances on one database, each with its own NATS connection,
// Relay and Sweeper: each publishes its own appends, and the sweep, which
// leaves commits younger than its grace to their owner, publishes none of
// them. Then instance 2 crashes between an append and its publish (its
// Relay and Sweeper stopped, the commit queued in a dead process): the
// sweep of instance 1 publishes the orphan. Every event ends in the
// stream exactly once under its id, and every commit is marked.
func TestRelayTwoInstancesAndAnOrphan(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	rc := func(owner string) outbox.Config {
		return outbox.Config{Owner: owner, SweepGrace: 3 * time.Second,
			SweepInterval: 50 * time.Millisecond, LeaseTTL: time.Second}
	}
	_, js1 := connectNATS(t, n.URL)
	_, js2 := connectNATS(t, n.URL)
	in1 := newInstance(t, db, js1, cfg, rc("api-1"))
	in2 := newInstance(t, db, js2, cfg, rc("api-2"))
	goRun(t, in1.relay.Run)
	goRun(t, in1.sweeper.Run)
	stopRelay2 := goRun(t, in2.relay.Run)
	stopSweeper2 := goRun(t, in2.sweeper.Run)

	var want []domain.Event
	var mine [2]int
	for range 3 {
		for i, in := range []*instance{in1, in2} {
			evs := appendCommits(t, in.store, 2, 2)
			want = append(want, evs...)
			mine[i] += len(evs)
		}
	}
	waitBacklog(t, in1.store, 10*time.Second, 0)
	for i, in := range []*instance{in1, in2} {
		if got := metric(t, in.relayReg, "orderd_relay_published_events_total"); got != float64(mine[i]) {
			t.Errorf("instance %d's relay published %v events, want its own %d", i+1, got, mine[i])
		}
		if got := metric(t, in.sweepReg, "orderd_relay_published_events_total"); got != 0 {
			t.Errorf("instance %d's sweeper published %v events of commits younger than its grace", i+1, got)
		}
	}
	checkPublishedOnce(t, n, cfg, want)

	// The crash of instance 2 between its append and its publish.
	stopRelay2()
	stopSweeper2()
	orphans := appendCommits(t, in2.store, 1, 2)
	want = append(want, orphans...)
	start := time.Now()
	storetest.WaitFor(t, 20*time.Second, "the orphans in the stream", func() bool {
		return streamCount(t, n.JS, cfg.Name) >= uint64(len(want))
	})
	t.Logf("orphans published %v after their append (grace 3s)", time.Since(start).Round(time.Millisecond))
	waitBacklog(t, in1.store, 10*time.Second, 0)
	checkPublishedOnce(t, n, cfg, want)
	if got := metric(t, in1.sweepReg, "orderd_relay_published_events_total"); got != float64(len(orphans)) {
		t.Errorf("instance 1's sweeper published %v events, want the %d orphans", got, len(orphans))
	}
}

// A sweeper that holds the lease but cannot publish gives it up, and a
// healthy standby publishes the orphans: when its NATS connection is
// closed, and when its publishes go unacknowledged (here: connected to a
// server without the stream) for half the lease.
func TestSweeperHandsOverWhenItCannotPublish(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, n *storetest.NATS) (jetstream.JetStream, func())
	}{
		{"connection closed", func(t *testing.T, n *storetest.NATS) (jetstream.JetStream, func()) {
			nc, js := connectNATS(t, n.URL)
			return js, nc.Close
		}},
		{"no acks", func(t *testing.T, n *storetest.NATS) (jetstream.JetStream, func()) {
			other, err := embedded.StartNATS(t.TempDir(), "127.0.0.1", -1)
			if err != nil {
				t.Fatalf("start nats: %v", err)
			}
			t.Cleanup(other.Shutdown)
			_, js := connectNATS(t, other.ClientURL())
			return js, func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, db, n, cfg := openOutbox(t)
			rc := func(owner string) outbox.Config {
				return outbox.Config{Owner: owner, SweepGrace: time.Millisecond,
					SweepInterval: 50 * time.Millisecond, LeaseTTL: time.Second}
			}
			jsA, breakA := tc.break_(t, n)
			regA := prometheus.NewRegistry()
			a := newSweeper(t, db, jsA, cfg, rc("a"), outbox.NewMetrics(regA))
			goRun(t, a.Run)
			storetest.WaitFor(t, 10*time.Second, "a to hold the sweep lease", func() bool {
				return metric(t, regA, "orderd_relay_leader") == 1
			})
			breakA()
			want := appendCommits(t, s, 2, 2) // no relay: all left to the sweep

			_, jsB := connectNATS(t, n.URL)
			regB := prometheus.NewRegistry()
			b := newSweeper(t, db, jsB, cfg, rc("b"), outbox.NewMetrics(regB))
			goRun(t, b.Run)
			start := time.Now()
			storetest.WaitFor(t, 20*time.Second, "the standby to publish the orphans", func() bool {
				return streamCount(t, n.JS, cfg.Name) >= uint64(len(want))
			})
			t.Logf("the standby published %v after it started (lease 1s)", time.Since(start).Round(time.Millisecond))
			waitBacklog(t, s, 10*time.Second, 0)
			checkPublishedOnce(t, n, cfg, want)
			if got := metric(t, regB, "orderd_relay_published_events_total"); got != float64(len(want)) {
				t.Errorf("the standby published %v events, want %d", got, len(want))
			}
			if got := metric(t, regA, "orderd_relay_leader"); got != 0 {
				t.Errorf("the broken sweeper's leader gauge is %v, want 0", got)
			}
		})
	}
}

// A window of publishes awaiting acks far smaller than a round does not
// fail the Relay or Republish: their sends wait for room.
func TestPublishWindowPacesRounds(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	js, err := jetstream.New(n.Conn, jetstream.WithPublishAsyncMaxPending(2))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	in := newInstance(t, db, js, cfg, outbox.Config{Owner: "api-1"})
	want := appendCommits(t, in.store, 4, 3) // 12 commits of 1 to 3 events, queued
	stop := goRun(t, in.relay.Run)
	waitBacklog(t, in.store, 10*time.Second, 0)
	stop()
	checkPublishedOnce(t, n, cfg, want)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if k, err := bus.NewPublisher(js, cfg).Republish(ctx, want); err != nil || k != len(want) {
		t.Fatalf("republish %d events through a window of 2: %d acknowledged, %v", len(want), k, err)
	}
	checkPublishedOnce(t, n, cfg, want)
}

// EnsureStream creates the stream, leaves one already as wanted alone,
// and updates one whose settings differ (here the partition transform).
func TestEnsureStreamUpdatesOnlyWhatDiffers(t *testing.T) {
	n := storetest.StartNATS(t)
	ctx := t.Context()
	cfg := bus.StreamConfig{Name: storetest.Unique("ENSURE"), SubjectPrefix: storetest.Unique("ensure"), Duplicates: time.Minute, Partitions: 4}
	transform := func() string {
		t.Helper()
		_, info := stream(t, n.JS, cfg.Name)
		if info.Config.SubjectTransform == nil {
			return ""
		}
		return info.Config.SubjectTransform.Destination
	}
	for range 2 {
		if err := bus.EnsureStream(ctx, n.JS, cfg); err != nil {
			t.Fatalf("ensure: %v", err)
		}
	}
	if got, want := transform(), cfg.SubjectPrefix+".{{partition(4,1)}}.{{wildcard(1)}}"; got != want {
		t.Fatalf("transform %q, want %q", got, want)
	}
	cfg.Partitions = 8
	if err := bus.EnsureStream(ctx, n.JS, cfg); err != nil {
		t.Fatalf("ensure with 8 partitions: %v", err)
	}
	if got, want := transform(), cfg.SubjectPrefix+".{{partition(8,1)}}.{{wildcard(1)}}"; got != want {
		t.Fatalf("after a change: transform %q, want %q", got, want)
	}
}

// readsThroughAnOutage is the sweeper's view of the log, where the read
// number outageAt finds the store stopped, and waits in server selection
// until it starts again, down later.
type readsThroughAnOutage struct {
	*mongodb.EventStore
	outageAt int
	down     time.Duration
	stop     func()
	start    func()
	reads    int
	waited   chan struct{} // closed when the read through the outage returned
}

func (r *readsThroughAnOutage) Pending(ctx context.Context, before time.Time, limit int) ([]domain.RecordedCommit, error) {
	r.reads++
	if r.reads != r.outageAt {
		return r.EventStore.Pending(ctx, before, limit)
	}
	defer close(r.waited)
	r.stop()
	go func() {
		time.Sleep(r.down)
		r.start()
	}()
	return r.EventStore.Pending(ctx, before, limit)
}

// An outbox read that waited out a store outage, as a read in flight when
// a store stops does (the driver retries it when the store is back), says
// nothing of what a read costs: the sweeps after it keep their pace, and a
// commit left behind after the outage is published within a few sweep
// intervals, not after ten times the outage.
func TestSweeperPaceAfterAReadThatWaitedOutAnOutage(t *testing.T) {
	// Always an embedded store, also with MONGODB_URI: the test stops it.
	dir := t.TempDir()
	var (
		mu    sync.Mutex
		store *embedded.Store
	)
	start := func(addr string) {
		s, err := embedded.StartStore(dir, addr, nil)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("start the store on %s: %v", addr, err)
			return
		}
		store = s
	}
	stop := func() {
		mu.Lock()
		defer mu.Unlock()
		if store != nil {
			_ = store.Close()
			store = nil
		}
	}
	addr := freeport.Addr(t)
	start(addr)
	t.Cleanup(stop)
	uri := store.URI
	cl, err := mongo.Connect(mongodb.ClientOptions(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Disconnect(context.Background()) })
	db := cl.Database(storetest.Unique("outage_"))
	s := mongodb.NewEventStore(db)
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatal(err)
	}
	n := storetest.StartNATS(t)
	stream := storetest.NewStream(t, n)
	_, js := connectNATS(t, n.URL)

	const down = 3 * time.Second
	commits := &readsThroughAnOutage{EventStore: mongodb.NewEventStore(db), outageAt: 3, down: down, waited: make(chan struct{}),
		stop: stop, start: func() { start(addr) }}
	cfg := outbox.Config{Owner: "api-1", SweepInterval: 100 * time.Millisecond, SweepGrace: 100 * time.Millisecond}
	lease := mongodb.NewLease(db, outbox.SweepLease, cfg.Owner, outbox.DefaultLeaseTTL)
	sw := outbox.NewSweeper(commits, bus.NewPublisher(js, stream), lease, cfg, testLogger(t), nil)
	goRun(t, sw.Run)
	select {
	case <-commits.waited:
	case <-time.After(time.Minute):
		t.Fatal("the sweeper made no read through the outage within a minute")
	}

	// Left behind: appended without a relay.
	want := appendCommits(t, s, 1, 1)
	// The sweeper reads every 100ms when idle; paced by the read through
	// the outage, it would wait ten times the outage (30s).
	waitBacklog(t, s, 10*time.Second, 0)
	checkPublishedOnce(t, n, stream, want)
}

// heldRead is the sweeper's view of the log where the first read that
// finds commits is held, with its answer, until release is closed.
type heldRead struct {
	*mongodb.EventStore
	once    sync.Once
	held    chan struct{} // closed when the read is held
	release chan struct{}
}

func (r *heldRead) Pending(ctx context.Context, before time.Time, limit int) ([]domain.RecordedCommit, error) {
	commits, err := r.EventStore.Pending(ctx, before, limit)
	if err == nil && len(commits) > 0 {
		r.once.Do(func() {
			close(r.held)
			<-r.release
		})
	}
	return commits, err
}

// A sweeper whose outbox read outlasts its lease (the read waited out an
// outage or an election) renews before it publishes what it read: when
// another instance claimed the lease meanwhile, it publishes none of it
// (invariant 6), and the new holder publishes the commits.
func TestSweeperRenewsBeforePublishingAfterALongRead(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	reg := prometheus.NewRegistry()
	commits := &heldRead{EventStore: mongodb.NewEventStore(db), held: make(chan struct{}), release: make(chan struct{})}
	rc := outbox.Config{Owner: "r1", SweepInterval: 20 * time.Millisecond, SweepGrace: time.Millisecond, LeaseTTL: 300 * time.Millisecond}
	lease := mongodb.NewLease(db, outbox.SweepLease, rc.Owner, rc.LeaseTTL)
	sw := outbox.NewSweeper(commits, bus.NewPublisher(n.JS, cfg), lease, rc, testLogger(t), outbox.NewMetrics(reg))
	goRun(t, sw.Run)
	want := appendCommits(t, s, 2, 2) // no relay: all left to the sweep
	select {
	case <-commits.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the sweeper read no commit within 30s")
	}

	// r1's lease lapses during its read, and another instance claims it.
	other := mongodb.NewLease(db, outbox.SweepLease, "r2", time.Minute)
	storetest.WaitFor(t, 10*time.Second, "r2 to claim the lapsed lease", func() bool {
		ok, err := other.TryAcquire(t.Context())
		return ok && err == nil
	})
	close(commits.release)
	storetest.WaitFor(t, 10*time.Second, "r1 to find its lease gone", func() bool {
		return metric(t, reg, "orderd_relay_leader") == 0
	})
	if got := streamCount(t, n.JS, cfg.Name); got != 0 {
		t.Fatalf("r1 published %d messages of a read that outlasted its lease, taken by r2 meanwhile", got)
	}
	wantBacklog(t, s, 4)

	// The holder sweeps them.
	r2 := newSweeper(t, db, n.JS, cfg, outbox.Config{Owner: "r2", SweepInterval: 20 * time.Millisecond,
		SweepGrace: time.Millisecond, LeaseTTL: time.Minute}, nil)
	goRun(t, r2.Run)
	waitBacklog(t, s, 10*time.Second, 0)
	checkPublishedOnce(t, n, cfg, want)
}

// slowRead is an outbox whose every read takes delay.
type slowRead struct {
	*mongodb.EventStore
	delay time.Duration
}

func (r *slowRead) Pending(ctx context.Context, before time.Time, limit int) ([]domain.RecordedCommit, error) {
	time.Sleep(r.delay)
	return r.EventStore.Pending(ctx, before, limit)
}

// An idle sweeper paced by slow outbox reads (ten times a read that costs
// more than a tenth of a renewal period) still renews its lease every
// LeaseTTL/3: the pace spaces its reads, not its renewals, so a standby
// never takes the lease from a healthy holder.
func TestSweeperIdleOnSlowReadsKeepsItsLease(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	reg := prometheus.NewRegistry()
	rc := outbox.Config{Owner: "r1", SweepInterval: 20 * time.Millisecond, SweepGrace: time.Millisecond, LeaseTTL: time.Second}
	lease := mongodb.NewLease(db, outbox.SweepLease, rc.Owner, rc.LeaseTTL)
	commits := &slowRead{EventStore: mongodb.NewEventStore(db), delay: 150 * time.Millisecond} // a pace of 1.5s, above the TTL
	sw := outbox.NewSweeper(commits, bus.NewPublisher(n.JS, cfg), lease, rc, testLogger(t), outbox.NewMetrics(reg))
	goRun(t, sw.Run)
	storetest.WaitFor(t, 10*time.Second, "r1 to hold the sweep lease", func() bool {
		return metric(t, reg, "orderd_relay_leader") == 1
	})
	other := mongodb.NewLease(db, outbox.SweepLease, "r2", time.Minute)
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok, err := other.TryAcquire(t.Context()); err != nil || ok {
			t.Fatalf("a standby claimed the lease of an idle, healthy sweeper: %v, %v", ok, err)
		}
	}
}

// A Relay that cannot keep up says how full its queues are, and counts
// each append it had no room for (left to the sweep): the API refuses
// commands on the first before the second happens.
func TestRelayBacklog(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := outbox.NewRelay(nil, nil, outbox.Config{QueueSize: 4}, testLogger(t), outbox.NewMetrics(reg))
	for i := range 6 { // not running: nothing is taken off the queue
		if got, want := r.Backlog(), float64(min(i, 4))/4; got != want {
			t.Fatalf("after %d appends: Backlog %v, want %v", i, got, want)
		}
		r.Appended(domain.RecordedCommit{ID: fmt.Sprint(i)})
	}
	if n := metric(t, reg, "orderd_relay_appends_left_to_sweep_total"); n != 2 {
		t.Errorf("appends left to the sweep: %v, want 2", n)
	}
}

// watchedPublisher passes sends to a bus.Publisher and counts the rounds
// sent and the rounds whose wait for acks has returned.
type watchedPublisher struct {
	*bus.Publisher
	mu              sync.Mutex
	sent, settled   int
	sentWhileActive []int // for each send, the rounds in flight before it
}

func (p *watchedPublisher) Send(ctx context.Context, commits [][]domain.Event, within time.Duration) func() ([]int, error) {
	p.mu.Lock()
	p.sentWhileActive = append(p.sentWhileActive, p.sent-p.settled)
	p.sent++
	p.mu.Unlock()
	wait := p.Publisher.Send(ctx, commits, within)
	return func() ([]int, error) {
		acked, err := wait()
		p.mu.Lock()
		p.settled++
		p.mu.Unlock()
		return acked, err
	}
}

// With a backlog the Relay sends its next rounds while the acks of the
// ones before are still to be waited for, and the stream still holds each
// stream's events in version order, each once.
func TestRelaySendsRoundsWithoutWaitingForEachOnesAcks(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	pub := &watchedPublisher{Publisher: bus.NewPublisher(n.JS, cfg)}
	ocfg := outbox.Config{Owner: "api-1", BatchSize: 8, QueueSize: 1000}
	relay := outbox.NewRelay(mongodb.NewEventStore(db), pub, ocfg, testLogger(t), outbox.NewMetrics(prometheus.NewRegistry()))
	store := mongodb.NewEventStore(db, mongodb.WithAppendHook(relay.Appended))
	want := appendCommits(t, store, 10, 8) // 80 commits queued: 10 rounds
	stop := goRun(t, relay.Run)
	storetest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d events in the stream", len(want)), func() bool {
		return streamCount(t, n.JS, cfg.Name) >= uint64(len(want))
	})
	waitBacklog(t, store, 10*time.Second, 0)
	stop()
	checkPublishedOnce(t, n, cfg, want)
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.sent < 10 {
		t.Fatalf("%d rounds sent, want at least 10 of 8 commits", pub.sent)
	}
	// The first rounds are sent from the queued backlog one after the
	// other, whatever NATS answers meanwhile.
	for i := 1; i < 4; i++ {
		if pub.sentWhileActive[i] != i {
			t.Errorf("round %d was sent with %d rounds in flight, want %d: rounds in flight %v",
				i+1, pub.sentWhileActive[i], i, pub.sentWhileActive)
		}
	}
	if most := slices.Max(pub.sentWhileActive); most >= 4 {
		t.Errorf("a round was sent with %d rounds in flight, want at most 3: %v", most, pub.sentWhileActive)
	}
}
