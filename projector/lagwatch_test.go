package projector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// TestLagWatchKeepsTheConsumersThatAnswer: while one partition's consumer
// does not answer (here its info is denied to the watch's NATS user; in
// production its leader is being elected), a LagWatch's sample keeps the
// lag of the consumers that did answer, a lower bound, with the
// projection's lag in seconds and apply rate unknown. The sample stays
// fresh, so an API instance keeps refusing commands on it instead of
// admitting every one.
func TestLagWatchKeepsTheConsumersThatAnswer(t *testing.T) {
	ctx := projectiontest.Context(t, 90*time.Second)
	log := projectiontest.Logger(t)
	es, db := storetest.OpenStore(t)
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	stream := bus.StreamConfig{Name: "ORDERS", SubjectPrefix: "orders.events", Duplicates: time.Minute, Partitions: 4}
	cfg := projector.RunnerConfig{Stream: stream.Name, SubjectPrefix: stream.SubjectPrefix, Partitions: stream.Partitions}
	const silent = 3 // the last partition read, so the others answer first
	denied := fmt.Sprintf("$JS.API.CONSUMER.INFO.%s.%s", stream.Name,
		projector.NewRunner(p, nil, nil, cfg, log, nil).ConsumerName(silent))

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true, Users: []*server.User{
			{Username: "relay", Password: "relay"},
			{Username: "watch", Password: "watch", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{denied}}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats not ready")
	}
	full := bustest.ConnectTo(t, ns.ClientURL(), nats.UserInfo("relay", "relay"))
	if err := bus.EnsureStream(ctx, full, stream); err != nil {
		t.Fatal(err)
	}
	b := &projectortest.Bus{NATS: &storetest.NATS{URL: ns.ClientURL(), JS: full, Server: ns}, Stream: stream}
	owner := projector.NewRunner(p, full, mongodb.NewDeadLetters(db), cfg, log, nil)
	var total, unanswered uint64
	for part := range cfg.Partitions {
		if _, err := owner.Consumer(ctx, part); err != nil {
			t.Fatal(err)
		}
	}
	f := projectiontest.NewFixture(t, ctx, es, "lag", 12, 3)
	b.PublishEvents(t, ctx, f.Flat, "")
	for part := range cfg.Partitions {
		c, err := owner.Consumer(ctx, part)
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total += info.NumPending
		if part == silent {
			unanswered = info.NumPending
		}
	}
	if unanswered == 0 || unanswered == total {
		t.Fatalf("fixture: partition %d holds %d of %d messages; want some, not all", silent, unanswered, total)
	}

	answering := projector.NewLagWatch([]*projector.Runner{owner}, 250*time.Millisecond, log)
	projectiontest.Go(t, "lag watch", answering.Run)
	restricted := bustest.ConnectTo(t, ns.ClientURL(), nats.UserInfo("watch", "watch"))
	partial := projector.NewLagWatch([]*projector.Runner{projector.NewRunner(p, restricted, nil, cfg, log, nil)}, 500*time.Millisecond, log)
	projectiontest.Go(t, "partial lag watch", partial.Run)

	projectiontest.WaitFor(t, 30*time.Second, "every consumer's lag", func() error {
		lag, name, _, fresh := answering.Latest()
		if _, known := answering.LagSeconds(owner.Name()); !fresh || lag != total || name != owner.Name() || !known {
			return fmt.Errorf("lag %d of %s (fresh %v, seconds known %v), want %d", lag, name, fresh, known, total)
		}
		return nil
	})
	projectiontest.WaitFor(t, 30*time.Second, "the answering consumers' lag", func() error {
		lag, name, rate, fresh := partial.Latest()
		if !fresh || lag != total-unanswered || name != owner.Name() || rate != 0 {
			return fmt.Errorf("lag %d of %s at %v/s (fresh %v), want %d at 0/s", lag, name, rate, fresh, total-unanswered)
		}
		if secs, known := partial.LagSeconds(owner.Name()); known {
			return fmt.Errorf("lag seconds %v known without partition %d", secs, silent)
		}
		return nil
	})
}
