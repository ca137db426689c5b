package projector_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// -chaos.long: more rounds of node losses under load (make chaos).
var chaosLong = flag.Bool("chaos.long", false, "run the fault tests with more rounds and load (make chaos)")

// countingLease is the sweep lease, counting the times its sweeper gave it
// up while it ran.
type countingLease struct {
	outbox.Lease
	releases atomic.Int64
}

func (l *countingLease) Release(ctx context.Context) error {
	l.releases.Add(1)
	return l.Lease.Release(ctx)
}

// TestNATSClusterLosesNodes runs the relay and the projectors against a
// three-node JetStream cluster, the stream at R3, under a small load of
// commands, and kills nodes as production loses them: the stream leader's
// node (then starts it again on its ports and store), then the meta
// leader's. The relay's sweeper keeps its lease, the projectors keep their
// partitions through the meta leader's loss, publishing and projecting
// resume within seconds of the stream and its consumers having leaders
// (measured from then until new orders are in the read model; the raft
// elections themselves take 4-9 s after a crash), and in the end every
// event of the log is in the stream once and the read models equal the
// fold.
func TestNATSClusterLosesNodes(t *testing.T) {
	rounds, limit := 1, 150*time.Second
	if *chaosLong {
		rounds, limit = 4, 600*time.Second
	}
	ctx := projectiontest.Context(t, limit)
	log := projectiontest.Logger(t)
	cl := bustest.StartCluster(t, 3)
	stream := bus.StreamConfig{Name: "ORDERS", SubjectPrefix: "orders.events", Duplicates: 2 * time.Minute, Partitions: 4, Replicas: 3}
	connect := func() jetstream.JetStream { return bustest.ConnectTo(t, cl.URL()) }
	js := connect()
	projectiontest.WaitFor(t, 60*time.Second, "the stream at R3", func() error { return bus.EnsureStream(ctx, js, stream) })
	cl.WaitStreamLeader(stream.Name, 30*time.Second)
	b := &projectortest.Bus{NATS: &storetest.NATS{URL: cl.URL(), JS: js}, Stream: stream}
	es, db := storetest.OpenStore(t)

	// The relay, on its own connection, with the service's settings but a
	// shorter ack timeout: a publish that reached the stream leader as its
	// node died is never acknowledged, and the round waits out the ack
	// timeout (10 s by default) before it publishes again from the
	// checkpoint.
	rjs := connect()
	rcfg := outbox.Config{Owner: "relay-1", AckTimeout: 5 * time.Second}
	lease := &countingLease{Lease: mongodb.NewLease(db, outbox.RelayLease, rcfg.Owner, outbox.DefaultLeaseTTL)}
	projectiontest.Go(t, "relay", outbox.NewRelay(es, bus.NewPublisher(rjs, stream), lease, rcfg, log, outbox.NewMetrics(prometheus.NewRegistry())).Run)

	// One projector process, own connection, with both projections.
	pjs := connect()
	cfg := b.RunnerConfig()
	cfg.Owner = "P"
	pointers := mongodb.NewPointers(db)
	dead := mongodb.NewDeadLetters(db)
	sums := projector.NewRunner(mongodb.NewProjection(db, projection.OrderSummaries, es, nil, pointers), pjs, dead, cfg, log, nil)
	stats := projector.NewRunner(mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, pointers), pjs, dead, cfg, log, nil)
	projectiontest.Go(t, "summaries runner", sums.Run)
	projectiontest.Go(t, "stats runner", stats.Run)

	// The load: orders placed and moved through their lifecycle one after
	// another, every command acknowledged recorded.
	svc := domain.NewService(es, nil)
	var (
		mu       sync.Mutex
		ids      []string
		acked    = map[string]int64{} // order: last acknowledged version
		inFlight string               // the order whose command the end of the load cut off
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	load.Go(func() {
		for i := 0; loadCtx.Err() == nil; i++ {
			id := fmt.Sprintf("load%04d", i)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			for _, cmd := range commands(i, fmt.Sprintf("cust-%d", i%5)) {
				res, err := svc.Execute(loadCtx, id, cmd, domain.ExecOptions{})
				if err != nil {
					if loadCtx.Err() == nil {
						t.Errorf("%s %s: %v", domain.CommandName(cmd), id, err)
					}
					mu.Lock()
					inFlight = id
					mu.Unlock()
					return
				}
				mu.Lock()
				acked[id] = res.Version
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // a small load, not a flood
			}
		}
	})
	defer func() {
		stopLoad()
		load.Wait()
	}()

	reader := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	probes := 0
	// recovered measures, from now (the stream has a leader), how long new
	// orders take to reach the read model: the relay and every partition's
	// consumer working again (sixteen orders miss one of four partitions
	// once in 25 runs).
	recovered := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		var probe []string
		for range 16 {
			probes++
			id := fmt.Sprintf("probe%03d", probes)
			res, err := svc.Execute(ctx, id, commands(0, "cust-probe")[0], domain.ExecOptions{})
			if err != nil {
				t.Fatalf("probe %s: %v", id, err)
			}
			mu.Lock()
			ids, acked[id] = append(ids, id), res.Version
			mu.Unlock()
			probe = append(probe, id)
		}
		projectiontest.WaitFor(t, 60*time.Second, what+": the probe orders in the read model", func() error {
			for _, id := range probe {
				if _, err := reader.Summary(ctx, id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
			}
			return nil
		})
		return time.Since(start)
	}
	t.Logf("healthy cluster: commands reach the read model in %v", recovered("healthy").Round(time.Millisecond))

	// led waits until the stream and every partition's consumer have a
	// leader, and returns how long that took since killed.
	led := func(killed time.Time) time.Duration {
		t.Helper()
		cl.WaitStreamLeader(stream.Name, 30*time.Second)
		for _, r := range []*projector.Runner{sums, stats} {
			for p := range r.Partitions() {
				cl.WaitConsumerLeader(stream.Name, r.ConsumerName(p), 30*time.Second)
			}
		}
		return time.Since(killed)
	}
	var worst time.Duration
	var sweeperHandOvers int64
	for round := range rounds {
		// The stream leader's node dies, and comes back on its ports and
		// store.
		sl := cl.WaitStreamLeader(stream.Name, 30*time.Second)
		releasesBefore := lease.releases.Load()
		killed := time.Now()
		cl.Kill(sl)
		nl := cl.WaitStreamLeader(stream.Name, 30*time.Second)
		elected := time.Since(killed)
		all := led(killed)
		took := recovered(fmt.Sprintf("round %d, stream leader %s lost", round, cl.Name(sl)))
		worst = max(worst, took)
		t.Logf("round %d: stream leader %s killed; %s leads the stream after %v, every consumer has a leader after %v; commands reach the read model %v after that",
			round, cl.Name(sl), cl.Name(nl), elected.Round(time.Millisecond), all.Round(time.Millisecond), took.Round(time.Millisecond))
		// A stream without a leader is every instance's outage: another
		// holder of the sweep lease would fare no better. The sweeper
		// still hands its lease over now and then: while the cluster
		// elects, the stream may answer its info yet refuse the round's
		// publishes ("duplicate message id is in process"), which reads as
		// this sweeper's own trouble. Logged, not asserted: what the
		// fault must not cost (an acknowledged command, an event, the
		// read models' convergence) is asserted below.
		sweeperHandOvers += lease.releases.Load() - releasesBefore
		cl.Start(sl)
		projectiontest.WaitFor(t, 60*time.Second, cl.Name(sl)+" caught up", func() error {
			if !cl.StreamCurrent(stream.Name) {
				return errors.New("a replica is behind")
			}
			return nil
		})

		// The meta leader's node dies: the stream keeps (or soon has) a
		// leader, and the projector keeps its partitions.
		ml := cl.WaitMetaLeader(30 * time.Second)
		releasesBefore = lease.releases.Load()
		killed = time.Now()
		cl.Kill(ml)
		nl = cl.WaitStreamLeader(stream.Name, 30*time.Second)
		elected = time.Since(killed)
		newMeta := cl.WaitMetaLeader(30 * time.Second)
		metaElected := time.Since(killed)
		all = led(killed)
		took = recovered(fmt.Sprintf("round %d, meta leader %s lost", round, cl.Name(ml)))
		worst = max(worst, took)
		t.Logf("round %d: meta leader %s killed; the stream led by %s after %v, the meta group by %s after %v, every consumer after %v; commands reach the read model %v after that",
			round, cl.Name(ml), cl.Name(nl), elected.Round(time.Millisecond), cl.Name(newMeta), metaElected.Round(time.Millisecond), all.Round(time.Millisecond), took.Round(time.Millisecond))
		sweeperHandOvers += lease.releases.Load() - releasesBefore // see the stream leader's round
		cl.Start(ml)
		projectiontest.WaitFor(t, 60*time.Second, cl.Name(ml)+" caught up", func() error {
			if !cl.StreamCurrent(stream.Name) {
				return errors.New("a replica is behind")
			}
			return nil
		})
	}
	// Most rounds take 0.1-8 s. A relay that restarts its tail first reads
	// the positions the stream holds since its checkpoint less the
	// catch-up margin (the rollup's log positions, docs/relay.md), and
	// right after an election that read can time out (5 s) a few times:
	// rounds of 21, 23 and 29 s were seen, quiet and busy. This bound
	// catches a relay or a partition that never comes back, not a slow
	// election; the rounds' times are logged above.
	if worst > time.Minute {
		t.Errorf("commands reached the read model %v after the stream and its consumers had leaders again; want within a minute", worst)
	}

	stopLoad()
	load.Wait()
	// Every commit published once, every acknowledged command in the log,
	// the read models equal to the fold.
	mu.Lock()
	defer mu.Unlock()
	f := projectiontest.LoadFixture(t, ctx, es, ids)
	events := 0
	for _, id := range ids {
		evs, err := es.Load(ctx, id, 0)
		if err != nil && !errors.Is(err, domain.ErrNotFound) {
			t.Fatal(err)
		}
		events += len(evs)
		// The last command may be in the log without its answer.
		if n := int64(len(evs)); n != acked[id] && (id != inFlight || n != acked[id]+1) {
			t.Errorf("order %s: %d events in the log, %d acknowledged", id, n, acked[id])
		}
	}
	if got := b.Messages(t, ctx); got != uint64(events) {
		t.Errorf("the stream holds %d messages, the log %d events; want each event once", got, events)
	}
	projectiontest.WaitFor(t, 60*time.Second, "read models equal to the fold", func() error { return projectiontest.DiffReadModels(ctx, db, f, true) })
	projectortest.WaitLag(t, ctx, 30*time.Second, sums, stats)
	t.Logf("%d orders, %d events; worst time from the stream and its consumers led again to commands in the read model: %v; the sweeper handed its lease over %d times",
		len(ids), events, worst.Round(time.Millisecond), sweeperHandOvers)
}

// TestNATSClusterMetaGroupWithoutQuorum: in a five-node cluster, three
// nodes die (the two that hold no replica of the R3 stream and one
// follower of it), so the meta group has no leader for as long as they are
// down while the stream and its consumers keep a quorum. The projector
// keeps its partitions and goes on applying what the relay publishes:
// nothing it uses needs the meta leader.
func TestNATSClusterMetaGroupWithoutQuorum(t *testing.T) {
	ctx := projectiontest.Context(t, 150*time.Second)
	log := projectiontest.Logger(t)
	cl := bustest.StartCluster(t, 5)
	stream := bus.StreamConfig{Name: "ORDERS", SubjectPrefix: "orders.events", Duplicates: 2 * time.Minute, Partitions: 4, Replicas: 3}
	js := bustest.ConnectTo(t, cl.URL())
	projectiontest.WaitFor(t, 60*time.Second, "the stream at R3", func() error { return bus.EnsureStream(ctx, js, stream) })
	sl := cl.WaitStreamLeader(stream.Name, 30*time.Second)
	b := &projectortest.Bus{NATS: &storetest.NATS{URL: cl.URL(), JS: js}, Stream: stream}
	es, db := storetest.OpenStore(t)
	relayLog(t, es, db, b, log)

	cfg := b.RunnerConfig()
	// The service's pinned TTL and batches.
	cfg.Owner, cfg.PinnedTTL, cfg.BatchSize = "P", 10*time.Second, 0
	sums := projector.NewRunner(mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db)),
		bustest.ConnectTo(t, b.URL), mongodb.NewDeadLetters(db), cfg, log, nil)
	stats := projector.NewRunner(mongodb.NewProjection(db, projectiontest.CustomerTotals, es, nil, mongodb.NewPointers(db)),
		bustest.ConnectTo(t, b.URL), mongodb.NewDeadLetters(db), cfg, log, nil)
	projectiontest.Go(t, "summaries runner", sums.Run)
	projectiontest.Go(t, "stats runner", stats.Run)
	svc := domain.NewService(es, nil)
	ids := writeOrders(t, ctx, svc, "q", 0, 5)
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})

	// Kill the nodes without a replica and one follower.
	peers := cl.StreamPeers(stream.Name)
	if len(peers) != 3 {
		t.Fatalf("stream replicas on nodes %v, want 3", peers)
	}
	var killed []string
	follower := false
	for i := range 5 {
		isPeer := false
		for _, p := range peers {
			isPeer = isPeer || p == i
		}
		if !isPeer || (i != sl && !follower) {
			follower = follower || isPeer
			cl.Kill(i)
			killed = append(killed, cl.Name(i))
		}
	}
	start := time.Now()
	projectiontest.WaitFor(t, 60*time.Second, "the meta group without a leader", func() error {
		if i := cl.MetaLeader(); i >= 0 {
			return fmt.Errorf("%s still leads", cl.Name(i))
		}
		return nil
	})
	t.Logf("killed %v; the meta group lost its leader after %v", killed, time.Since(start).Round(time.Millisecond))

	// More than a whole pinned TTL passes without a meta leader, while
	// orders are written and projected.
	until := time.Now().Add(3 * cfg.PinnedTTL / 2)
	for i := 5; time.Now().Before(until); i += 2 {
		ids = append(ids, writeOrders(t, ctx, svc, "q", i, i+2)...)
	}
	projectiontest.WaitFor(t, 30*time.Second, "read models equal to the fold without a meta leader", func() error {
		return projectiontest.DiffReadModels(ctx, db, projectiontest.LoadFixture(t, ctx, es, ids), true)
	})
	if cl.MetaLeader() >= 0 {
		t.Fatalf("the meta group had a leader again before the end")
	}
	for _, r := range []*projector.Runner{sums, stats} {
		if got := owners(t, ctx, r); got["P"] != 4 {
			t.Errorf("%s: partitions held as %v without a meta leader; want all 4 by P", r.Name(), got)
		}
	}
}
