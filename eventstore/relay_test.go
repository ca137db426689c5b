package eventstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/embedded"
	"github.com/orderd/orderd/eventstore/storetest"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// appendCommits appends commits to a few fresh streams, 1 to 3 events each,
// and returns the stored events (as Load returns them) in append order.
func appendCommits(t *testing.T, s *eventstore.Store, streams, perStream int, after ...func()) []domain.Event {
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

// streamMessages reads every message of the JetStream stream by sequence.
func streamMessages(t *testing.T, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	var out []*jetstream.RawStreamMsg
	if info.State.Msgs == 0 {
		return out
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream %s seq %d: %v", name, seq, err)
		}
		out = append(out, m)
	}
	return out
}

func streamCount(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	st, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	return info.State.Msgs
}

// checkPublishedOnce asserts that the stream holds exactly the events of
// want, each once, on its stream's subject with Nats-Msg-Id = event id and
// the event as its body, each stream's events in version order.
func checkPublishedOnce(t *testing.T, n *storetest.NATS, cfg eventstore.StreamConfig, want []domain.Event) {
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

// outbox counts the commits by their published marker and checks that the
// published ones carry published_at.
func outbox(t *testing.T, db *mongo.Database) (published, unpublished int64) {
	t.Helper()
	coll := db.Collection(eventstore.CommitsCollection)
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
func drain(t *testing.T, r *eventstore.Relay, rounds int) []int {
	t.Helper()
	var got []int
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for range rounds {
		k, err := r.PublishPending(ctx)
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

func wantBacklog(t *testing.T, r *eventstore.Relay, want int64) {
	t.Helper()
	n, age, err := r.Backlog(t.Context())
	if err != nil || n != want || (want == 0) != (age == 0) || age < 0 {
		t.Errorf("backlog: %d commits, oldest %v, %v; want %d", n, age, err, want)
	}
}

// runRelay runs r.Run until the returned stop is called (also in cleanup);
// stop waits for Run to return and fails the test if it takes over 10s or
// returns an error.
func runRelay(t *testing.T, r *eventstore.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("relay run did not return within 10s of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond every 20ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRelayPublishesEachEventOnce(t *testing.T) {
	s, db := openStore(t)
	n := storetest.StartNATS(t)
	cfg := storetest.NewStream(t, n)
	want := appendCommits(t, s, 3, 3) // 9 commits
	r := eventstore.NewRelay(s, n.JS, eventstore.RelayConfig{Stream: cfg, Owner: "r1", BatchSize: 4}, testLogger(t), nil)
	wantBacklog(t, r, 9)

	// One sweep takes up to 16 batches (here all 9 commits) and publishes
	// them in batches of 4; the next finds nothing.
	if rounds := drain(t, r, 10); !slices.Equal(rounds, []int{9, 0}) {
		t.Errorf("rounds read %v commits, want [9 0]", rounds)
	}
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := outbox(t, db); pub != 9 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 9, 0", pub, unpub)
	}
	wantBacklog(t, r, 0)

	// Later commits are published once too, and nothing earlier again.
	want = append(want, appendCommits(t, s, 2, 1)...)
	drain(t, r, 3)
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := outbox(t, db); pub != 11 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 11, 0", pub, unpub)
	}
}

func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	s, db := openStore(t)
	n := storetest.StartNATS(t)
	cfg := storetest.NewStream(t, n)
	want := appendCommits(t, s, 2, 3) // 6 commits
	first := eventstore.NewRelay(s, n.JS, eventstore.RelayConfig{Stream: cfg, Owner: "r1"}, testLogger(t), nil)
	drain(t, first, 3)
	checkPublishedOnce(t, n, cfg, want)

	// The crash: the messages are in the stream, the marks are lost.
	res, err := db.Collection(eventstore.CommitsCollection).UpdateMany(t.Context(), bson.D{},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: false}}}, {Key: "$unset", Value: bson.D{{Key: "published_at", Value: ""}}}})
	if err != nil || res.ModifiedCount != 6 {
		t.Fatalf("reset marks: %+v, %v", res, err)
	}
	wantBacklog(t, first, 6)

	// The restarted relay publishes them again; JetStream drops the copies.
	second := eventstore.NewRelay(s, n.JS, eventstore.RelayConfig{Stream: cfg, Owner: "r2"}, testLogger(t), nil)
	if rounds := drain(t, second, 3); !slices.Equal(rounds, []int{6, 0}) {
		t.Errorf("rounds read %v commits, want [6 0]", rounds)
	}
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := outbox(t, db); pub != 6 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 6, 0", pub, unpub)
	}
	wantBacklog(t, second, 0)
}

func TestRelayNATSDown(t *testing.T) {
	// Always an embedded server, also with NATS_URL: the test stops it.
	dir := t.TempDir()
	ns, err := embedded.StartNATS(dir, "127.0.0.1", -1)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(ns.Shutdown)
	u, err := url.Parse(ns.ClientURL())
	if err != nil {
		t.Fatalf("client url %q: %v", ns.ClientURL(), err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("client url %q: %v", ns.ClientURL(), err)
	}
	connect := func(srv string) *storetest.NATS {
		nc, err := nats.Connect(srv, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
		if err != nil {
			t.Fatalf("connect nats: %v", err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatalf("jetstream: %v", err)
		}
		return &storetest.NATS{URL: srv, Conn: nc, JS: js, Server: ns}
	}

	s, db := openStore(t)
	n := connect(ns.ClientURL())
	cfg := storetest.NewStream(t, n)
	rcfg := eventstore.RelayConfig{Stream: cfg, Owner: "r1", AckTimeout: 500 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	r := eventstore.NewRelay(s, n.JS, rcfg, testLogger(t), nil)
	want := appendCommits(t, s, 2, 1)
	drain(t, r, 3)

	ns.Shutdown()
	ns.WaitForShutdown()
	down := appendCommits(t, s, 2, 2) // appends do not need NATS
	want = append(want, down...)
	for i := range 2 {
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		k, err := r.PublishPending(ctx)
		cancel()
		if err == nil || time.Since(start) > 5*time.Second {
			t.Fatalf("publish round %d with NATS down: read %d commits, %v after %v; want an error within the 500ms ack timeout",
				i, k, err, time.Since(start))
		}
		t.Logf("publish with NATS down: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	if pub, unpub := outbox(t, db); pub != 2 || unpub != 4 {
		t.Errorf("%d commits published, %d not; want 2, 4", pub, unpub)
	}
	wantBacklog(t, r, 4)
	n.Conn.Close()

	// The same port and store: the stream and its de-duplication state
	// come back; a new connection's relay publishes the backlog.
	ns, err = embedded.StartNATS(dir, "127.0.0.1", port)
	if err != nil {
		t.Fatalf("restart nats on port %d: %v", port, err)
	}
	t.Cleanup(ns.Shutdown)
	n = connect(ns.ClientURL())
	if got := streamCount(t, n.JS, cfg.Name); got != uint64(len(want)-len(down)) {
		t.Fatalf("after the restart the stream holds %d messages, want %d", got, len(want)-len(down))
	}
	r = eventstore.NewRelay(s, n.JS, rcfg, testLogger(t), nil)
	stop := runRelay(t, r)
	waitFor(t, 10*time.Second, "the backlog to be published", func() bool {
		k, _, err := r.Backlog(t.Context())
		return err == nil && k == 0
	})
	stop()
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := outbox(t, db); pub != 6 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 6, 0", pub, unpub)
	}

	// The restarted server still remembers the message ids: republishing
	// everything (marks lost) adds nothing.
	if _, err := db.Collection(eventstore.CommitsCollection).UpdateMany(t.Context(), bson.D{},
		bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: false}}}}); err != nil {
		t.Fatalf("reset marks: %v", err)
	}
	drain(t, r, 3)
	checkPublishedOnce(t, n, cfg, want)
}

func TestLease(t *testing.T) {
	const ttl = 300 * time.Millisecond
	ctx := t.Context()
	db := storetest.Database(t)
	name := storetest.Unique("relay-")
	// Claims that must exclude the other owner last a minute, so a slow
	// machine cannot let them expire between two steps; the expiry step
	// uses a claim of ttl.
	a := eventstore.NewLease(db, name, "a", time.Minute)
	b := eventstore.NewLease(db, name, "b", time.Minute)
	aShort := eventstore.NewLease(db, name, "a", ttl)
	try := func(l *eventstore.Lease, who string, want bool) {
		t.Helper()
		got, err := l.TryAcquire(ctx)
		if err != nil || got != want {
			t.Fatalf("%s: TryAcquire = %v, %v; want %v", who, got, err, want)
		}
	}

	try(a, "a claims the free lease", true)
	try(b, "b while a holds it", false)
	try(a, "a renews", true)
	try(b, "b after a renewed", false)
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b releases a lease it does not hold: %v", err)
	}
	try(b, "b after its own release of a's lease", false)

	// a renews for ttl only and then stops: b gets the lease once that
	// claim has expired, not before.
	renewed := time.Now() // before the claim: a's expiry is at least this + ttl
	try(aShort, "a renews for the short ttl", true)
	waitFor(t, 5*time.Second, "b to take over the expired lease", func() bool {
		ok, err := b.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("b: %v", err)
		}
		return ok
	})
	if took := time.Since(renewed); took < ttl-5*time.Millisecond {
		t.Errorf("b took the lease %v after a's renewal; the TTL is %v", took, ttl)
	}
	try(a, "a after b took over", false)
	try(aShort, "a (short ttl) after b took over", false)
	try(b, "b renews", true)

	// Release hands over at once.
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b releases: %v", err)
	}
	try(a, "a right after b's release", true)
	try(b, "b after a took over", false)

	// Many claimants of a free lease: exactly one wins.
	other := storetest.Unique("job-")
	const claimants = 8
	wins := make([]bool, claimants)
	errs := make([]error, claimants)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claimants {
		wg.Go(func() {
			<-start
			wins[i], errs[i] = eventstore.NewLease(db, other, fmt.Sprintf("c%d", i), time.Minute).TryAcquire(ctx)
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for i := range claimants {
		if errs[i] != nil {
			t.Errorf("claimant %d: %v", i, errs[i])
		}
		if wins[i] {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d of %d claimants hold the lease, want 1", won, claimants)
	}
}

func TestRelayRunEndToEnd(t *testing.T) {
	s, db := openStore(t)
	n := storetest.StartNATS(t)
	cfg := storetest.NewStream(t, n)
	// Sweeps of the outbox are an hour apart after the first: the appends
	// reach the relay through its hints and Notify alone.
	r := eventstore.NewRelay(s, n.JS, eventstore.RelayConfig{Stream: cfg, Owner: "r1", PollInterval: time.Hour}, testLogger(t), nil)
	stop := runRelay(t, r)

	start := time.Now()
	want := appendCommits(t, s, 10, 5, r.Notify) // 50 commits, each followed by Notify
	waitFor(t, 10*time.Second, fmt.Sprintf("%d events in the stream", len(want)), func() bool {
		return streamCount(t, n.JS, cfg.Name) >= uint64(len(want))
	})
	published := time.Now()
	// Marking trails publishing; on FerretDB under the race detector each
	// marker update costs a collection scan, so allow it more time.
	waitFor(t, 30*time.Second, "the relay to mark every commit", func() bool {
		k, _, err := r.Backlog(t.Context())
		return err == nil && k == 0
	})
	t.Logf("all events in the stream %v after the first append; all marked %v later",
		published.Sub(start).Round(time.Millisecond), time.Since(published).Round(time.Millisecond))
	stop()
	wantBacklog(t, r, 0)
	checkPublishedOnce(t, n, cfg, want)
	if pub, unpub := outbox(t, db); pub != 50 || unpub != 0 {
		t.Errorf("%d commits published, %d not; want 50, 0", pub, unpub)
	}
	// Run released its lease on the way out: another instance takes it at once.
	if ok, err := eventstore.NewLease(db, "relay", "next", time.Minute).TryAcquire(t.Context()); !ok || err != nil {
		t.Errorf("lease after Run returned: %v, %v; want it free", ok, err)
	}
}

func TestRelayRunWaitsForLease(t *testing.T) {
	s, db := openStore(t)
	n := storetest.StartNATS(t)
	cfg := storetest.NewStream(t, n)
	holder := eventstore.NewLease(db, "relay", "other-instance", time.Minute)
	if ok, err := holder.TryAcquire(t.Context()); !ok || err != nil {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	r := eventstore.NewRelay(s, n.JS, eventstore.RelayConfig{Stream: cfg, Owner: "r1",
		PollInterval: 20 * time.Millisecond, LeaseTTL: 300 * time.Millisecond}, testLogger(t), nil)
	stop := runRelay(t, r)
	want := appendCommits(t, s, 2, 2)
	r.Notify()

	// Several lease periods of the relay pass: it must not publish.
	time.Sleep(500 * time.Millisecond)
	if got := streamCount(t, n.JS, cfg.Name); got != 0 {
		t.Fatalf("the relay published %d messages while another instance held the lease", got)
	}
	wantBacklog(t, r, 4)

	if err := holder.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
	waitFor(t, 5*time.Second, "the relay to take over and publish", func() bool {
		k, _, err := r.Backlog(t.Context())
		return err == nil && k == 0
	})
	stop()
	checkPublishedOnce(t, n, cfg, want)
	if ok, err := holder.TryAcquire(t.Context()); !ok || err != nil {
		t.Errorf("the old holder after the relay stopped: %v, %v; want the lease back", ok, err)
	}
}
