package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/internal/freeport"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/outbox"
)

// The MongoDB adapter's event store and lease are the relay's.
var (
	_ outbox.Log   = (*mongodb.EventStore)(nil)
	_ outbox.Lease = (*mongodb.Lease)(nil)
)

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
	return s, db, n, storetest.NewStream(t, n, 0)
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

// checkPositions asserts that the messages carry log positions that name
// one event each: every copy of an event at its first copy's position,
// and the first copies at 1, 2, 3... in stream order. With inOrder false
// the first copies hold 1, 2, 3... in any order: a round that failed in
// an outage of the bus while a later one got through is stored after it
// (docs/relay.md).
func checkPositions(t *testing.T, msgs []*jetstream.RawStreamMsg, inOrder bool) {
	t.Helper()
	first := map[string]uint64{}
	held := map[uint64]string{}
	for _, m := range msgs {
		id, pos := m.Header.Get(jetstream.MsgIDHeader), bus.Position(m.Header)
		p, seen := first[id]
		switch {
		case seen && pos != p:
			t.Errorf("seq %d: event %s again at log position %d, first published at %d", m.Sequence, id, pos, p)
		case !seen && inOrder && pos != uint64(len(first)+1):
			t.Errorf("seq %d: event %s, the %d. published, at log position %d", m.Sequence, id, len(first)+1, pos)
		case !seen && held[pos] != "":
			t.Errorf("seq %d: event %s at log position %d, which event %s holds", m.Sequence, id, pos, held[pos])
		}
		if !seen {
			first[id], held[pos] = pos, id
		}
	}
	for pos := uint64(1); pos <= uint64(len(first)); pos++ {
		if held[pos] == "" {
			t.Errorf("no event at log position %d of 1 to %d", pos, len(first))
		}
	}
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
	checkPositions(t, msgs, true)
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
	js := bustest.ConnectTo(r.t, srv, nats.ReconnectWait(20*time.Millisecond))
	return &storetest.NATS{URL: srv, JS: js, Server: r.srv}
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

// A window of publishes awaiting acks far smaller than a round does not
// fail the relay or Republish: their sends wait for room.
func TestPublishWindowPacesRounds(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	js, err := jetstream.New(n.JS.Conn(), jetstream.WithPublishAsyncMaxPending(2))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	want := appendCommits(t, s, 4, 3) // 12 commits of 1 to 3 events
	stop := goRun(t, newRelay(t, db, bus.NewPublisher(js, cfg), outbox.Config{Owner: "relay-1"}).Run)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	stop()
	checkPublishedOnce(t, n, cfg, want)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if k, err := bus.NewPublisher(js, cfg).Republish(ctx, want); err != nil || k != len(want) {
		t.Fatalf("republish %d events through a window of 2: %d acknowledged, %v", len(want), k, err)
	}
	checkPublishedOnce(t, n, cfg, want)
}

// relayOf is one instance's relay on db's log, publishing to stream
// through js, under the relay lease of cfg.LeaseTTL for cfg.Owner, with
// metrics of its own.
type relayOf struct {
	*outbox.Relay
	lease *mongodb.Lease
	reg   *prometheus.Registry
}

func newRelay(t testing.TB, db *mongo.Database, pub outbox.Publisher, cfg outbox.Config) *relayOf {
	t.Helper()
	cfg = cfg.WithDefaults()
	r := &relayOf{lease: mongodb.NewLease(db, outbox.RelayLease, cfg.Owner, cfg.LeaseTTL), reg: prometheus.NewRegistry()}
	r.Relay = outbox.NewRelay(mongodb.NewEventStore(db), pub, r.lease, cfg, testLogger(t), outbox.NewMetrics(r.reg))
	return r
}

// waitPublished waits until the stream holds n messages.
func waitPublished(t *testing.T, n *storetest.NATS, cfg bus.StreamConfig, want int, within time.Duration) {
	t.Helper()
	projectiontest.WaitFor(t, within, fmt.Sprintf("%d events in the stream", want), func() error {
		if got := streamCount(t, n.JS, cfg.Name); got < uint64(want) {
			return fmt.Errorf("%d in the stream", got)
		}
		return nil
	})
}

// waitCheckpoint waits until the relay lease holds a checkpoint.
func waitCheckpoint(t *testing.T, db *mongo.Database, what string) {
	t.Helper()
	projectiontest.WaitFor(t, 10*time.Second, what, func() error {
		if pos, _ := checkpointOf(t, db); pos == nil {
			return errors.New("no checkpoint saved")
		}
		return nil
	})
}

// checkpointOf reads the relay lease's checkpoint as stored.
func checkpointOf(t *testing.T, db *mongo.Database) ([]byte, time.Time) {
	t.Helper()
	cp, err := mongodb.NewLease(db, outbox.RelayLease, "reader", time.Second).Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("read the relay checkpoint: %v", err)
	}
	return cp.Token, cp.RecordedAt
}

// The relay publishes every commit of the log once, in commit order per
// stream: those appended before it first started (a log without a
// checkpoint) and those appended while it tails, and it saves a
// checkpoint as it goes.
func TestRelayPublishesTheLogOnce(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	want := appendCommits(t, s, 3, 2) // before the first relay: no checkpoint yet
	r := newRelay(t, db, bus.NewPublisher(n.JS, cfg), outbox.Config{Owner: "relay-1", BatchSize: 4})
	goRun(t, r.Run)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	want = append(want, appendCommits(t, s, 4, 3)...)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	checkPublishedOnce(t, n, cfg, want)
	waitCheckpoint(t, db, "a checkpoint")
	if got := metric(t, r.reg, "orderd_relay_catchups_total"); got != 0 {
		t.Errorf("%v catch-ups on a log that never lost its stream, want 0", got)
	}
	projectiontest.WaitFor(t, 10*time.Second, "an idle relay's lag at 0", func() error {
		if lag, behind := metric(t, r.reg, "orderd_relay_lag_seconds"), metric(t, r.reg, "orderd_relay_commits_behind"); lag != 0 || behind != 0 {
			return fmt.Errorf("lag %vs, %v commits behind", lag, behind)
		}
		return nil
	})
}

// A relay that dies without releasing its lease (a killed process) is
// followed, once the lease has expired, by another instance that resumes
// from the checkpoint: every commit is in the stream once, those
// appended while no relay ran too.
func TestRelayResumesFromTheCheckpointAfterACrash(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 4, LeaseTTL: 2 * time.Second}
	a := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	dying := &unreleased{Lease: a.lease}
	relayA := outbox.NewRelay(s, bus.NewPublisher(n.JS, cfg), dying, ocfg.WithDefaults(), testLogger(t), outbox.NewMetrics(prometheus.NewRegistry()))
	stopA := goRun(t, relayA.Run)
	want := appendCommits(t, s, 3, 4)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	waitCheckpoint(t, db, "a checkpoint")
	stopA() // its lease stays claimed until it expires
	want = append(want, appendCommits(t, s, 5, 2)...)

	ocfg.Owner = "relay-2"
	b := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	goRun(t, b.Run)
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	checkPublishedOnce(t, n, cfg, want)
}

// unreleased is a relay lease whose Release does nothing, as when the
// process holding it is killed.
type unreleased struct{ *mongodb.Lease }

func (unreleased) Release(context.Context) error { return nil }

// recreateLog drops the log's collection and creates it again with the
// same commits (a restore from a backup, say): a position of the old
// collection's change stream cannot be resumed from.
func recreateLog(t *testing.T, db *mongo.Database) {
	t.Helper()
	ctx := t.Context()
	coll := db.Collection(mongodb.CommitsCollection)
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatalf("read the log: %v", err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("read the log: %v", err)
	}
	if err := coll.Drop(ctx); err != nil {
		t.Fatalf("drop the log: %v", err)
	}
	if err := mongodb.NewEventStore(db).EnsureIndexes(ctx); err != nil {
		t.Fatalf("indexes of the new log: %v", err)
	}
	batch := make([]any, len(docs))
	for i, d := range docs {
		batch[i] = d
	}
	if _, err := coll.InsertMany(ctx, batch); err != nil {
		t.Fatalf("restore the log: %v", err)
	}
}

// forgetHistory makes the store forget the log's change-stream history up
// to now, as when MongoDB's oplog has rolled past the checkpoint, with the
// embedded store's test command; it skips the test on a store without it.
func forgetHistory(t *testing.T, db *mongo.Database) {
	t.Helper()
	err := db.RunCommand(t.Context(), bson.D{{Key: embedded.ForgetChangesCommand, Value: mongodb.CommitsCollection}}).Err()
	var se mongo.ServerError
	if errors.As(err, &se) && (se.HasErrorCode(59) || se.HasErrorCode(115)) { // CommandNotFound, CommandNotSupported
		t.Skipf("the store cannot forget change-stream history (%v): MongoDB's oplog rolls on its own", err)
	}
	if err != nil {
		t.Fatalf("forget the log's history: %v", err)
	}
}

// When the change stream cannot resume from the checkpoint (its history
// was lost, or its collection was dropped and created again), the relay
// catches up from the log: the commits recorded since the checkpoint less
// the margin are published, each stream's in version order, it counts the
// catch-up, and it tails the stream from then on. None is skipped.
func TestRelayCatchesUpWhenItsStreamCannotResume(t *testing.T) {
	for name, lose := range map[string]func(*testing.T, *mongo.Database){
		"history forgotten":     forgetHistory,
		"collection re-created": recreateLog,
	} {
		t.Run(name, func(t *testing.T) { testCatchUp(t, lose) })
	}
}

func testCatchUp(t *testing.T, lose func(*testing.T, *mongo.Database)) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 4, CatchUpMargin: 5 * time.Second}
	a := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stopA := goRun(t, a.Run)
	want := appendCommits(t, s, 3, 2)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	waitCheckpoint(t, db, "a checkpoint")
	stopA()

	want = append(want, appendCommits(t, s, 4, 2)...) // after the checkpoint
	lose(t, db)
	b := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	goRun(t, b.Run)
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	projectiontest.WaitFor(t, 10*time.Second, "the catch-up counted", func() error {
		if got := metric(t, b.reg, "orderd_relay_catchups_total"); got != 1 {
			return fmt.Errorf("%v catch-ups", got)
		}
		return nil
	})
	if got := metric(t, b.reg, "orderd_relay_last_catchup_timestamp_seconds"); got <= 0 {
		t.Errorf("last catch-up time %v, want set", got)
	}
	// Tailing again: a commit appended now is published from the stream.
	want = append(want, appendCommits(t, s, 1, 1)...)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	checkPublishedOnce(t, n, cfg, want)
	if got := metric(t, b.reg, "orderd_relay_catchups_total"); got != 1 {
		t.Errorf("%v catch-ups, want 1", got)
	}
}

// A catch-up from the log publishes again events the stream holds, past
// its de-duplication window: each copy carries the log position of the
// event's first publish, and the events new to the stream take the
// positions after the highest, so that a position names one event.
func TestRelayCatchUpKeepsEachEventsPosition(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	cfg.Duplicates = 200 * time.Millisecond
	if err := bus.EnsureStream(t.Context(), n.JS, cfg); err != nil {
		t.Fatal(err)
	}
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 4, CatchUpMargin: time.Minute}
	a := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stopA := goRun(t, a.Run)
	want := appendCommits(t, s, 3, 3)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	waitCheckpoint(t, db, "a checkpoint")
	stopA()
	published := len(want)
	want = append(want, appendCommits(t, s, 2, 2)...) // after the checkpoint
	forgetHistory(t, db)
	time.Sleep(2 * cfg.Duplicates) // copies are stored from now on
	b := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	goRun(t, b.Run)
	// The catch-up publishes the whole log again (it is younger than the
	// margin): a copy of each of the first events, and the new ones.
	waitPublished(t, n, cfg, published+len(want), 30*time.Second)
	msgs := streamMessages(t, n.JS, cfg.Name)
	checkPositions(t, msgs, true)
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[m.Header.Get(jetstream.MsgIDHeader)] = true
	}
	if len(ids) != len(want) {
		t.Errorf("%d events in the stream, want %d", len(ids), len(want))
	}
}

// On a log an earlier version wrote (each commit marked published once
// JetStream had it; no checkpoint), the first relay publishes the commits
// left unmarked, and those of this version, and not the ones marked long
// before them.
func TestRelayFirstStartOnAnUpgradedLog(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	coll := db.Collection(mongodb.CommitsCollection)
	old := appendCommits(t, s, 2, 2)
	left := appendCommits(t, s, 2, 1)
	mark := func(events []domain.Event, published bool, age time.Duration) {
		for _, e := range events {
			if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "stream_id", Value: e.StreamID}, {Key: "first_version", Value: bson.D{{Key: "$lte", Value: e.Version}}},
				{Key: "last_version", Value: bson.D{{Key: "$gte", Value: e.Version}}}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: published}, {Key: "recorded_at", Value: time.Now().Add(-age)}}}}); err != nil {
				t.Fatalf("make the commit of %s an earlier version's: %v", e.ID, err)
			}
		}
	}
	mark(old, true, 2*time.Hour)
	mark(left, false, time.Hour)
	want := left
	r := newRelay(t, db, bus.NewPublisher(n.JS, cfg), outbox.Config{Owner: "relay-1"})
	goRun(t, r.Run)
	want = append(want, appendCommits(t, s, 2, 2)...)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	checkPublishedOnce(t, n, cfg, want)
}

// heldAcks passes sends to a bus.Publisher, holding every wait for acks
// while held is set.
type heldAcks struct {
	*bus.Publisher
	mu   sync.Mutex
	held chan struct{} // closed to let the waits return; nil when not holding
	sent chan struct{} // signalled at each send while holding
}

func (p *heldAcks) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.sent = make(chan struct{}), make(chan struct{}, 100)
}

func (p *heldAcks) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.held)
	p.held = nil
}

func (p *heldAcks) Send(ctx context.Context, commits []domain.RecordedCommit, positions []uint64, within time.Duration) func() ([]int, uint64, error) {
	p.mu.Lock()
	held, sent := p.held, p.sent
	p.mu.Unlock()
	wait := p.Publisher.Send(ctx, commits, positions, within)
	if held == nil {
		return wait
	}
	sent <- struct{}{}
	return func() ([]int, uint64, error) {
		<-held
		return wait()
	}
}

// savesOf records the outcome of each checkpoint a relay saves.
type savesOf struct {
	*mongodb.Lease
	errs chan error
}

func (l savesOf) SaveCheckpoint(ctx context.Context, cp outbox.Checkpoint) error {
	err := l.Lease.SaveCheckpoint(ctx, cp)
	l.errs <- err
	return err
}

// A relay deposed while a round waits for its acks (its lease expired
// and another instance claimed it and published on) cannot move the
// checkpoint: its late write, of a position before its successor's, is
// refused, and the stored checkpoint stays the successor's.
func TestRelayCheckpointIsFencedByTheLease(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 4, LeaseTTL: 2 * time.Second, AckTimeout: time.Minute}
	pubA := &heldAcks{Publisher: bus.NewPublisher(n.JS, cfg)}
	leaseA := savesOf{Lease: mongodb.NewLease(db, outbox.RelayLease, ocfg.Owner, ocfg.LeaseTTL), errs: make(chan error, 1000)}
	relayA := outbox.NewRelay(s, pubA, leaseA, ocfg, testLogger(t), outbox.NewMetrics(prometheus.NewRegistry()))
	goRun(t, relayA.Run)
	want := appendCommits(t, s, 2, 2)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	waitCheckpoint(t, db, "a checkpoint")

	pubA.hold()
	want = append(want, appendCommits(t, s, 1, 1)...)
	select {
	case <-pubA.sent:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay sent no round within 20s")
	}
	// relay-1 waits for acks it will not get until released; its lease
	// expires and relay-2 claims it and publishes on.
	ocfg.Owner = "relay-2"
	b := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stopB := goRun(t, b.Run)
	want = append(want, appendCommits(t, s, 3, 1)...)
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	projectiontest.WaitFor(t, 20*time.Second, "relay-2's checkpoint after every commit", func() error {
		if behind, leader := metric(t, b.reg, "orderd_relay_commits_behind"), metric(t, b.reg, "orderd_relay_leader"); behind != 0 || leader != 1 {
			return fmt.Errorf("%v commits behind, leader %v", behind, leader)
		}
		return nil
	})
	stopB()
	successors, _ := checkpointOf(t, db)
	for len(leaseA.errs) > 0 {
		<-leaseA.errs
	}

	pubA.release()
	select {
	case err := <-leaseA.errs:
		if !errors.Is(err, domain.ErrLeaseLost) {
			t.Fatalf("the deposed relay's checkpoint: %v, want ErrLeaseLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the deposed relay tried no checkpoint within 20s of its acks")
	}
	if now, _ := checkpointOf(t, db); !bytes.Equal(now, successors) {
		t.Fatalf("the checkpoint moved after the deposed relay's write:\nwas %x\nis  %x", successors, now)
	}
	checkPublishedOnce(t, n, cfg, want)
}

// The relay holds nothing while NATS is away: the log is the buffer, and
// the commits appended during the outage are published once it is back.
func TestRelayPublishesThroughAnOutage(t *testing.T) {
	ns := newRestartableNATS(t)
	s, db := storetest.OpenStore(t)
	n := ns.connect()
	cfg := storetest.NewStream(t, n, 0)
	r := newRelay(t, db, bus.NewPublisher(n.JS, cfg), outbox.Config{Owner: "relay-1", AckTimeout: 300 * time.Millisecond})
	goRun(t, r.Run)
	want := appendCommits(t, s, 2, 1)
	waitPublished(t, n, cfg, len(want), 20*time.Second)

	ns.stop()
	want = append(want, appendCommits(t, s, 3, 2)...)
	// The relay sees the outage: a round fails, or it stands down before
	// it sends one.
	projectiontest.WaitFor(t, 20*time.Second, "a failed publish round or the relay standing down", func() error {
		if errs, leader := metric(t, r.reg, "orderd_relay_publish_errors_total"), metric(t, r.reg, "orderd_relay_leader"); errs < 1 && leader != 0 {
			return fmt.Errorf("%v publish errors, leader %v", errs, leader)
		}
		return nil
	})
	ns.start()
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	checkPublishedOnce(t, n, cfg, want)
}

// countingPositions is a bus publisher that counts the relay's reads of
// the positions the bus holds.
type countingPositions struct {
	outbox.Publisher
	mu    sync.Mutex
	reads int
}

func (c *countingPositions) Positions(ctx context.Context, since time.Time, floor uint64) (map[string]uint64, uint64, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Publisher.Positions(ctx, since, floor)
}

// TestRelayRestartsUnderItsLeaseWithoutReadingPositionsBack: a relay whose
// rounds fail in an outage of the bus keeps its lease, and its tail
// starts again from the checkpoint, giving the events it sends again the
// positions it gave them, without reading them back from the bus (which
// timed out for seconds right after an election): no read after the
// first tail's, and every event is published once, at one of positions
// 1, 2, 3... each (a round that failed while a later one got through is
// stored after it).
func TestRelayRestartsUnderItsLeaseWithoutReadingPositionsBack(t *testing.T) {
	ns := newRestartableNATS(t)
	s, db := storetest.OpenStore(t)
	n := ns.connect()
	cfg := storetest.NewStream(t, n, 0)
	pub := &countingPositions{Publisher: bus.NewPublisher(n.JS, cfg)}
	r := newRelay(t, db, pub, outbox.Config{Owner: "relay-1", AckTimeout: 300 * time.Millisecond, LeaseTTL: time.Minute})
	goRun(t, r.Run)
	// On the empty log the first start saves a checkpoint and its tail
	// reads the positions once.
	var reads int
	projectiontest.WaitFor(t, 20*time.Second, "the tail's read of the positions", func() error {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		if reads = pub.reads; reads == 0 {
			return errors.New("no read yet")
		}
		return nil
	})
	want := appendCommits(t, s, 2, 1)
	waitPublished(t, n, cfg, len(want), 20*time.Second)

	ns.stop()
	want = append(want, appendCommits(t, s, 3, 2)...)
	projectiontest.WaitFor(t, 20*time.Second, "two failed publish rounds, or a read of the positions", func() error {
		pub.mu.Lock()
		defer pub.mu.Unlock()
		if errs := metric(t, r.reg, "orderd_relay_publish_errors_total"); errs < 2 && pub.reads <= reads {
			return fmt.Errorf("%v publish errors, %d reads", errs, pub.reads)
		}
		return nil
	})
	ns.start()
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	checkPublishedOnce(t, n, cfg, want)
	checkPositions(t, streamMessages(t, n.JS, cfg.Name), false)
	if got := metric(t, r.reg, "orderd_relay_leader"); got != 1 {
		t.Fatalf("relay leader %v after the outage, want it to have kept its lease", got)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.reads != reads {
		t.Errorf("the relay read the positions the bus holds %d times after its first tail, want none", pub.reads-reads)
	}
}

// With a backlog the relay sends its next rounds while the acks of the
// ones before are still to come: with every ack held, it sends rounds
// until roundsInFlight of them await their acks, and no more; once the
// acks come, the stream holds each stream's events in version order, each
// once.
func TestRelaySendsRoundsWithoutWaitingForEachOnesAcks(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 8, AckTimeout: time.Minute, LeaseTTL: time.Minute}
	// A first run leaves a checkpoint at the log's end, so the backlog
	// below is read from the change stream.
	first := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stop := goRun(t, first.Run)
	waitCheckpoint(t, db, "a checkpoint")
	stop()
	want := appendCommits(t, s, 10, 8) // 80 commits waiting: 10 rounds
	pub := &heldAcks{Publisher: bus.NewPublisher(n.JS, cfg)}
	pub.hold()
	r := newRelay(t, db, pub, ocfg)
	stop = goRun(t, r.Run)
	for i := range 4 {
		select {
		case <-pub.sent:
		case <-time.After(20 * time.Second):
			t.Fatalf("%d rounds sent with every ack held, want 4: the relay waits for acks before it sends", i)
		}
	}
	// The fifth waits for the first one's acks. A send it made anyway
	// would show within the relay's next batch (a few milliseconds);
	// this waits well past that.
	select {
	case <-pub.sent:
		t.Fatal("a fifth round sent with 4 rounds awaiting their acks")
	case <-time.After(2 * time.Second):
	}
	pub.release()
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	stop()
	checkPublishedOnce(t, n, cfg, want)
}

// A relay that stops releases its lease, so a standby can claim it at
// once rather than after the TTL.
func TestRelayReleasesItsLeaseWhenItStops(t *testing.T) {
	_, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", LeaseTTL: time.Hour}
	a := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stopA := goRun(t, a.Run)
	projectiontest.WaitFor(t, 10*time.Second, "relay-1 leading", func() error {
		if leader := metric(t, a.reg, "orderd_relay_leader"); leader != 1 {
			return fmt.Errorf("leader %v", leader)
		}
		return nil
	})
	other := mongodb.NewLease(db, outbox.RelayLease, "relay-2", time.Hour)
	if held, err := other.TryAcquire(t.Context()); err != nil || held {
		t.Fatalf("relay-2's claim while relay-1 leads: %v, %v; want refused", held, err)
	}
	stopA()
	if held, err := other.TryAcquire(t.Context()); err != nil || !held {
		t.Fatalf("relay-2's claim once relay-1 stopped: %v, %v; want held within a lease of an hour", held, err)
	}
}

// racingLog is a log on which a commit is appended while the relay's
// first start looks for unpublished commits: after the look, before it
// answers.
type racingLog struct {
	*mongodb.EventStore
	once   sync.Once
	append func()
}

func (l *racingLog) OldestUnpublished(ctx context.Context) (time.Time, bool, error) {
	at, found, err := l.EventStore.OldestUnpublished(ctx)
	l.once.Do(l.append)
	return at, found, err
}

// A commit appended while the first relay on an empty log looks for
// unpublished commits is published: the relay's stream was open before
// it looked.
func TestRelayFirstStartMissesNoCommitAppendedMeanwhile(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	appended := make(chan []domain.Event, 1)
	log := &racingLog{EventStore: s, append: func() { appended <- appendCommits(t, s, 1, 1) }}
	ocfg := outbox.Config{Owner: "relay-1"}.WithDefaults()
	lease := mongodb.NewLease(db, outbox.RelayLease, ocfg.Owner, ocfg.LeaseTTL)
	goRun(t, outbox.NewRelay(log, bus.NewPublisher(n.JS, cfg), lease, ocfg, testLogger(t), outbox.NewMetrics(prometheus.NewRegistry())).Run)
	var want []domain.Event
	select {
	case want = <-appended:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not look for unpublished commits within 20s")
	}
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	checkPublishedOnce(t, n, cfg, want)
}

// An idle relay saves its checkpoint every IdleCheckpoint on time alone:
// with nothing appended the embedded store's stream stays at its last
// insert (MongoDB's moves with the cluster's time), and the saved time is
// what tells an operator that the relay is alive.
func TestRelaySavesItsCheckpointWhileIdle(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	want := appendCommits(t, s, 1, 1)
	r := newRelay(t, db, bus.NewPublisher(n.JS, cfg), outbox.Config{Owner: "relay-1", IdleCheckpoint: 100 * time.Millisecond})
	goRun(t, r.Run)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	savedAt := func() time.Time {
		st, err := r.lease.Status(t.Context())
		if err != nil {
			t.Fatalf("relay status: %v", err)
		}
		return st.CheckpointSavedAt
	}
	projectiontest.WaitFor(t, 20*time.Second, "the checkpoint after the published commit", func() error {
		if pos, at := checkpointOf(t, db); pos == nil || at.Before(want[len(want)-1].RecordedAt) {
			return fmt.Errorf("checkpoint %x at %v", pos, at)
		}
		return nil
	})
	last := savedAt()
	for i := range 2 {
		projectiontest.WaitFor(t, 20*time.Second, fmt.Sprintf("idle checkpoint %d", i+1), func() error {
			if at := savedAt(); !at.After(last) {
				return fmt.Errorf("last saved at %v", at)
			}
			return nil
		})
		last = savedAt()
	}
	checkPublishedOnce(t, n, cfg, want)
}

// TestRelayNumbersWhatALostRoundHeldAsBefore: a relay that lost a round
// in a NATS election while a later one got through left the stream
// holding later positions without the earlier ones. The next holder of
// the lease numbers the commits after the checkpoint as the first did,
// from the checkpoint's position on, so the lost round's events get
// their positions and not numbers after the highest the stream holds
// (which would leave a hole the daily sales rollup could not fill).
func TestRelayNumbersWhatALostRoundHeldAsBefore(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", CatchUpMargin: time.Minute}
	stopA := goRun(t, newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg).Run)
	want := appendCommits(t, s, 2, 1)
	waitPublished(t, n, cfg, len(want), 20*time.Second)
	stopA() // its last checkpoint covers want
	published := len(want)
	want = append(want, appendCommits(t, s, 2, 2)...)
	// The first holder's round of the later half got through, the one
	// before it did not: publish the later half at the positions that
	// numbering from the checkpoint gives them.
	later := published + (len(want)-published)/2
	var commits []domain.RecordedCommit
	var positions []uint64
	for i := later; i < len(want); i++ {
		e := want[i]
		body, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		commits = append(commits, domain.RecordedCommit{StreamID: e.StreamID, FirstVersion: e.Version, RecordedAt: e.RecordedAt,
			Events: []domain.EventMessage{{ID: e.ID, Body: body}}, Count: 1})
		positions = append(positions, uint64(i+1))
	}
	if acked, _, err := bus.NewPublisher(n.JS, cfg).Send(t.Context(), commits, positions, time.Minute)(); err != nil || len(acked) != len(commits) {
		t.Fatalf("publish the later half: %d acknowledged, %v", len(acked), err)
	}
	ocfg.Owner = "relay-2"
	goRun(t, newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg).Run)
	waitPublished(t, n, cfg, len(want), 30*time.Second)
	at := map[string]uint64{}
	for _, m := range streamMessages(t, n.JS, cfg.Name) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if _, seen := at[id]; !seen {
			at[id] = bus.Position(m.Header)
		}
	}
	for i, e := range want {
		if at[e.ID] != uint64(i+1) {
			t.Errorf("event %d of the log (%s v%d) at position %d, want %d", i+1, e.StreamID, e.Version, at[e.ID], i+1)
		}
	}
}

// TestRelaySpacesItsCheckpointsWhileBusy: a relay with a backlog of 100
// rounds saves its checkpoint at most every 250 ms while it publishes
// them, not after each round, and the checkpoint after the last commit as
// soon as the stream has nothing new, long before IdleCheckpoint (30 s).
func TestRelaySpacesItsCheckpointsWhileBusy(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	ocfg := outbox.Config{Owner: "relay-1", BatchSize: 4, LeaseTTL: time.Minute}
	// A first run leaves a checkpoint at the log's end, so the backlog
	// below is read from the change stream.
	first := newRelay(t, db, bus.NewPublisher(n.JS, cfg), ocfg)
	stop := goRun(t, first.Run)
	waitCheckpoint(t, db, "a checkpoint")
	stop()
	want := appendCommits(t, s, 20, 20)
	lease := &countedLease{Lease: mongodb.NewLease(db, outbox.RelayLease, ocfg.Owner, ocfg.LeaseTTL)}
	r := outbox.NewRelay(mongodb.NewEventStore(db), bus.NewPublisher(n.JS, cfg), lease, ocfg, testLogger(t), outbox.NewMetrics(prometheus.NewRegistry()))
	began := time.Now()
	goRun(t, r.Run)
	projectiontest.WaitFor(t, 20*time.Second, "the checkpoint after the last commit", func() error {
		if _, at := checkpointOf(t, db); at.Before(want[len(want)-1].RecordedAt) {
			return fmt.Errorf("checkpoint at %v", at)
		}
		return nil
	})
	took := time.Since(began)
	lease.mu.Lock()
	saves := lease.saves
	lease.mu.Unlock()
	if limit := int(took/(250*time.Millisecond)) + 2; saves > limit {
		t.Errorf("%d checkpoints saved in %v publishing 100 rounds, want at most %d (one per 250 ms and the last)", saves, took.Round(time.Millisecond), limit)
	}
	checkPublishedOnce(t, n, cfg, want)
}

// countedLease counts the checkpoints saved through it.
type countedLease struct {
	outbox.Lease
	mu    sync.Mutex
	saves int
}

func (l *countedLease) SaveCheckpoint(ctx context.Context, cp outbox.Checkpoint) error {
	err := l.Lease.SaveCheckpoint(ctx, cp)
	if err == nil {
		l.mu.Lock()
		l.saves++
		l.mu.Unlock()
	}
	return err
}

// The relay's lag gauges count a round no more once JetStream has
// acknowledged it, not once the tail takes its acks in: after the last
// round of a burst the tail waits up to a second for the stream's next
// batch, and the gauges said the burst's last commits were still behind
// for that long.
func TestRelayLagIsZeroOnceEverythingIsAcknowledged(t *testing.T) {
	s, db, n, cfg := openOutbox(t)
	r := newRelay(t, db, bus.NewPublisher(n.JS, cfg), outbox.Config{Owner: "relay-1", BatchSize: 4})
	goRun(t, r.Run)
	waitCheckpoint(t, db, "the relay tailing")
	for round := range 3 {
		before := metric(t, r.reg, "orderd_relay_published_events_total")
		want := before + float64(len(appendCommits(t, s, 5, 3)))
		projectiontest.WaitFor(t, 20*time.Second, "the burst acknowledged", func() error {
			if got := metric(t, r.reg, "orderd_relay_published_events_total"); got < want {
				return fmt.Errorf("%v events published", got)
			}
			return nil
		})
		// Read at once: the tail has not taken the last acks in yet.
		if behind, lag := metric(t, r.reg, "orderd_relay_commits_behind"), metric(t, r.reg, "orderd_relay_lag_seconds"); behind != 0 || lag != 0 {
			t.Fatalf("burst %d: every event acknowledged, yet %v commits behind and a lag of %.3fs", round, behind, lag)
		}
	}
}
