package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// natsClusterResume bounds how long a partition may take, once the stream
// and the partition's summaries consumer have leaders again, to have an
// order placed at the kill in its read model: the relay's publish and the
// projector's consume both resumed, and the projector through what the
// stream stored ahead of the order: the commits the log took during the
// election, which the relay published once the stream led again.
// A relay that restarts its tail right after an election first reads
// the positions the stream holds since its checkpoint less the catch-up
// margin (docs/relay.md), and that read can time out (5 s) a few times:
// rounds of 21 to 29 s were seen here and in the in-process test of the
// same fault (projector, TestNATSClusterLosesNodes), on a quiet machine
// too. The bound catches a relay or a partition that never resumes, not
// a slow election; each round's times are logged.
const natsClusterResume = time.Minute

// natsClusterRelayCaughtUp is the relay lag (orderd_relay_lag_seconds: the
// age of the oldest commit it has read and JetStream not yet acknowledged)
// below which a node is killed: the relay is then publishing the load as
// it comes, not what the log took during the last fault.
const natsClusterRelayCaughtUp = 2 * time.Second

// TestChaos_NATSClusterLosesNodes runs the service against a three-node
// JetStream cluster (bustest, in the test process), the stream and the
// projections' consumers at R3: two `api,relay` processes and a
// `projector,jobs` process, under a load with races through both APIs. It
// kills the stream leader's node (crash-like: its routes cut, then
// stopped), starts it again on its ports and store and waits until its
// replica has caught up, then does the same to the meta leader's node
// (three rounds of both with -chaos.long); each kill waits until the relay
// has published what the log took during the last one (a relay leader,
// and its lag below natsClusterRelayCaughtUp). Right after each kill it places one order in each partition and
// measures, partition by partition, when the order is in the summaries
// read model over HTTP, and when the stream and that partition's
// summaries consumer had leaders again: each partition must resume within
// natsClusterResume of its own leaders, whatever the others do. Every
// probe must be acknowledged (the log, not the bus, decides). The run
// ends with the three checks of guarantees.
func TestChaos_NATSClusterLosesNodes(t *testing.T) {
	chaosParallel(t)
	rounds, loadFor := 1, 45*time.Second
	if *chaosLong {
		rounds, loadFor = 3, 150*time.Second
	}
	const stream, partitions = "ORDERS", projector.DefaultPartitions
	c := newCluster(t, withNATSCluster)
	api1 := c.add("api-1", "api,relay")
	api2 := c.add("api-2", "api,relay")
	worker := c.add("worker", "projector,jobs")
	apis := []*proc{api1, api2}
	consumers := partitionConsumers(partitions)

	var acks []loadgen.Ack
	healthy := c.probePartitions(apis, "natscluster-probe-healthy", partitions, time.Now())
	if healthy.err != nil {
		t.Fatalf("healthy cluster: %v", healthy.err)
	}
	acks = append(acks, healthy.acks...)
	c.stored(stream, healthy.ids) // partitionOf puts them where the stream does
	t.Logf("healthy cluster: an order in each of %d partitions is in the read model within %v (slowest partition)",
		partitions, slices.Max(healthy.visible).Round(time.Millisecond))

	wait, done := runLoad(t, loadgen.Config{URLs: []string{api1.url(), api2.url()}, Orders: 100_000, Duration: loadFor,
		Concurrency: 6, ConflictRate: 0.1, Seed: 22, RunID: "natscluster", RetryFor: time.Minute})
	// The first node dies once the load's events flow through the stream.
	js := c.jetStream()
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool { return c.streamMsgs(js, stream) >= partitions+500 }) {
		t.Fatal("the load's events not in the stream within a minute")
	}

	var worstAfterKill, worstAfterLed time.Duration
	kills, underLoad, paused := 0, 0, 0
	lose := func(round int, role string, node int) {
		t.Helper()
		// A node dies once the relay has published what the log took
		// during the previous fault: one instance leads the relay, and the
		// oldest commit it has read and JetStream not yet acknowledged is
		// younger than natsClusterRelayCaughtUp. Each round measures its
		// own fault.
		var leaders, lags []float64
		draining := time.Now()
		if !waitFor(2*time.Minute, 200*time.Millisecond, func() bool {
			leaders, lags = leaders[:0], lags[:0]
			for _, a := range apis {
				cl := &client{t: t, base: a.url(), http: &http.Client{Timeout: 10 * time.Second}}
				leaders = append(leaders, metric(t, cl, "orderd_relay_leader"))
				lags = append(lags, metric(t, cl, "orderd_relay_lag_seconds"))
			}
			return slices.Max(leaders) == 1 && slices.Max(lags) < natsClusterRelayCaughtUp.Seconds()
		}) {
			t.Fatalf("round %d: two minutes after the last fault the relay leaders are %v and their lags %vs; want one leader, lag below %v",
				round, leaders, lags, natsClusterRelayCaughtUp)
		}
		c.busFaults = true
		select {
		case <-done:
		default:
			underLoad++
		}
		kills++
		before := c.streamMsgs(js, stream)
		killed := time.Now()
		c.nodes.Kill(node)
		// The probes go out at once: commands are taken while the
		// cluster elects, and what they append waits in the log for the
		// relay.
		probed := make(chan probeResult, 1)
		go func() {
			probed <- c.probePartitions(apis, fmt.Sprintf("natscluster-probe-%d-%s", round, role), partitions, killed)
		}()
		streamLed, consumersLed := c.watchLeaders(stream, consumers, killed, time.Minute)
		r := <-probed
		acks = append(acks, r.acks...)
		if r.err != nil {
			t.Fatalf("round %d, %s leader %s killed: %v", round, role, c.nodes.Name(node), r.err)
		}

		// Per partition: since the stream and the partition's summaries
		// consumer had leaders, its order in the read model (resumed),
		// and of that, the projector's part: since the order was in the
		// stream and the consumer led.
		led, kept := make([]time.Duration, partitions), 0
		for p := range led {
			led[p] = max(streamLed, consumersLed[partitionConsumer(projection.OrderSummaries.Key(), p)])
		}
		for _, d := range consumersLed {
			if d == 0 {
				kept++
			}
		}
		var resumed, applied []time.Duration
		var published time.Duration // the relay's part: the last order stored, since the stream led
		for p, at := range c.stored(stream, r.ids) {
			inStream := at.Sub(killed)
			published = max(published, inStream-streamLed)
			resumed = append(resumed, max(0, r.visible[p]-led[p]))
			applied = append(applied, max(0, r.visible[p]-max(led[p], inStream)))
			if resumed[p] > natsClusterResume {
				t.Errorf("round %d, %s leader %s killed: partition %d's order in the read model %v after the stream and its consumer had leaders (%v after the kill, in the stream %v after it); want within %v",
					round, role, c.nodes.Name(node), p, resumed[p].Round(time.Millisecond), led[p].Round(time.Millisecond), inStream.Round(time.Millisecond), natsClusterResume)
			}
		}
		slowest := 0
		for p := range resumed {
			if resumed[p] > resumed[slowest] {
				slowest = p
			}
		}
		recovered := slices.Max(r.visible)
		worstAfterKill, worstAfterLed = max(worstAfterKill, recovered), max(worstAfterLed, resumed[slowest])
		t.Logf("round %d: %s leader %s killed at %s (the relay's lag %.3fs, after %v waiting for it to catch up); the stream led again after %v, every consumer after %v (%d of %d kept their leaders)",
			round, role, c.nodes.Name(node), killed.Format("15:04:05.000"), slices.Max(lags), killed.Sub(draining).Round(time.Millisecond),
			streamLed.Round(time.Millisecond), slices.Max(slices.Collect(maps.Values(consumersLed))).Round(time.Millisecond), kept, len(consumers))
		if r.paused > 0 {
			t.Logf("round %d: %d places of probe orders paused by the service and sent again; the first answer: %s", round, r.paused, r.pause)
		}
		paused += r.paused
		t.Logf("round %d: orders placed at the kill in the summaries in every partition after %v, the stream having taken %d messages since the kill; after the stream and the partition's consumer led %v (median), %v (slowest, partition %d): the relay's publishes in the stream %v after it led, the projector's writes %v (median) and %v (slowest) after the order was in the stream and its consumer led",
			round, recovered.Round(time.Millisecond), c.streamMsgs(js, stream)-before, median(resumed).Round(time.Millisecond), resumed[slowest].Round(time.Millisecond), slowest,
			published.Round(time.Millisecond), median(applied).Round(time.Millisecond), slices.Max(applied).Round(time.Millisecond))

		restarted := time.Now()
		c.nodes.Start(node)
		if !waitFor(time.Minute, 50*time.Millisecond, func() bool { return c.nodes.StreamCurrent(stream) }) {
			t.Fatalf("round %d: %s's replica of the stream not current a minute after its restart", round, c.nodes.Name(node))
		}
		t.Logf("round %d: %s started again, its replica current after %v", round, c.nodes.Name(node), time.Since(restarted).Round(time.Millisecond))
	}
	for round := range rounds {
		lose(round, "stream", c.nodes.WaitStreamLeader(stream, 30*time.Second))
		lose(round, "meta", c.nodes.WaitMetaLeader(30*time.Second))
	}
	rep := wait()
	t.Logf("loadgen: %d answers were pauses (the read models behind), each sent again after its Retry-After", rep.Paused)
	if underLoad == 0 || rep.Acked == 0 || rep.Races == 0 {
		t.Fatalf("the run proved little: %d of %d kills under load, %d commands acknowledged, %d races", underLoad, kills, rep.Acked, rep.Races)
	}
	f := c.guarantees(api1, "natscluster-", append(rep.Acks, acks...), rep.Unknown, nil)
	for _, p := range []*proc{api1, api2, worker} {
		n, top := p.warnings()
		t.Logf("%s logged %d warnings and errors; the most frequent: %v", p.name, n, top)
	}
	t.Logf("GUARANTEES NATS cluster losing nodes: %d commands acknowledged (%d probes, %d of their places paused and sent again), %d node kills (%d under load; stream leader, then meta leader, each restarted), every partition's new orders in the read model at most %v after a kill and %v after its leaders were back, %d events, drift %d",
		f.Acked, len(acks), paused, kills, underLoad, worstAfterKill.Round(time.Millisecond), worstAfterLed.Round(time.Millisecond), f.Events, f.Drift)
}

// streamMsgs is how many messages stream holds, 0 when it does not answer.
func (c *cluster) streamMsgs(js jetstream.JetStream, stream string) int {
	s, err := js.Stream(c.t.Context(), stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(c.t.Context())
	if err != nil {
		return 0
	}
	return int(info.State.Msgs)
}

// median is the middle of ds (the upper one of an even count).
func median(ds []time.Duration) time.Duration {
	return slices.Sorted(slices.Values(ds))[len(ds)/2]
}

// partitionOf is the partition JetStream stores an order's events in: the
// stream's subject transform partition(n,1), FNV-1a of the order id
// modulo n (nats-server, subject_transform.go, getHashPartition).
func partitionOf(orderID string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(orderID))
	return int(h.Sum32() % uint32(n))
}

// probeResult is what probePartitions saw: per partition, the probe
// order's id and how long after the start it was in the read model; the
// places the service paused (503 read-models-behind) and the first such
// answer.
type probeResult struct {
	ids     []string
	visible []time.Duration
	acks    []loadgen.Ack
	paused  int
	pause   string
	err     error
}

// probePartitions places one order in each of n partitions, "<prefix>-NNN"
// through apis in turn, and reads each one's summary over HTTP (waiting
// with ?min_version=1) until it is there, for at most two minutes. A place
// the service pauses, its read models behind, is sent again
// after the Retry-After with the same Idempotency-Key, as a client does;
// any other refusal fails the probe. It runs outside the test's
// goroutine: a failure is in the result's err.
func (c *cluster) probePartitions(apis []*proc, prefix string, n int, start time.Time) probeResult {
	r := probeResult{ids: make([]string, n), visible: make([]time.Duration, n), acks: make([]loadgen.Ack, n)}
	for k, filled := 0, 0; filled < n; k++ {
		id := fmt.Sprintf("%s-%03d", prefix, k)
		if p := partitionOf(id, n); r.ids[p] == "" {
			r.ids[p] = id
			filled++
		}
	}
	var mu sync.Mutex // guards paused and pause
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p, id := range r.ids {
		api := apis[p%len(apis)]
		wg.Go(func() {
			cl, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: api.url(), HTTPClient: &http.Client{Timeout: 40 * time.Second}})
			if err != nil {
				errs[p] = err
				return
			}
			ctx, key := context.Background(), id+"-place"
			place := domain.PlaceOrder{CustomerID: "probe-customer", Currency: "BRL", Items: []domain.Line{{SKU: "sku-1", Quantity: 1, UnitPriceCents: 990}}}
			deadline := time.Now().Add(2 * time.Minute)
			var res domain.Result
			for {
				res, err = cl.Execute(ctx, id, place, domain.ExecOptions{IdempotencyKey: key})
				var pe *orderhttp.Error
				if !errors.As(err, &pe) || !pe.Paused() || time.Now().After(deadline) {
					break
				}
				mu.Lock()
				r.paused++
				r.pause = cmp.Or(r.pause, pe.Error())
				mu.Unlock()
				time.Sleep(max(pe.RetryAfter, 100*time.Millisecond))
			}
			if err != nil {
				errs[p] = fmt.Errorf("place %s through %s, %v after the start: %w; want 201", id, api.name, time.Since(start).Round(time.Millisecond), err)
				return
			}
			r.acks[p] = loadgen.Ack{OrderID: id, Command: "place", Key: key, Version: res.Version, Status: string(res.Status)}
			for {
				_, _, err = cl.Summary(ctx, id, orderhttp.SummaryQuery{MinVersion: 1, Wait: 5 * time.Second})
				if err == nil {
					r.visible[p] = time.Since(start)
					return
				}
				if time.Now().After(deadline) {
					errs[p] = fmt.Errorf("partition %d's order %s not in the read model %v after the start: %w", p, id, time.Since(start).Round(time.Millisecond), err)
					return
				}
				if !errors.Is(err, domain.ErrNotFound) {
					time.Sleep(100 * time.Millisecond) // an answer other than the wait's 404: not a busy loop
				}
			}
		})
	}
	wg.Wait()
	r.err = errors.Join(errs...)
	r.acks = slices.DeleteFunc(r.acks, func(a loadgen.Ack) bool { return a.Key == "" })
	return r
}

// stored checks that the stream stored each ids[p] under partition p's
// subject, as partitionOf says, and returns when the stream's leader
// stored it.
func (c *cluster) stored(stream string, ids []string) []time.Time {
	c.t.Helper()
	s, err := c.jetStream().Stream(c.t.Context(), stream)
	if err != nil {
		c.t.Fatal(err)
	}
	at := make([]time.Time, len(ids))
	for p, id := range ids {
		// Right after an election the stream's API can answer 503 for a
		// while: ask again until it answers, within a bound.
		var m *jetstream.RawStreamMsg
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			m, err = s.GetLastMsgForSubject(c.t.Context(), fmt.Sprintf("%s.%d.%s", subjectPrefix, p, id))
			if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			c.t.Fatalf("order %s: no message in partition %d, where partitionOf puts it: %v", id, p, err)
		}
		at[p] = m.Time
	}
	return at
}

// watchLeaders waits until the stream and every consumer of consumers
// have a leader among the running nodes, for at most limit. It returns
// how long after since the stream had one and, by name, each consumer
// had (0: it had one all along).
func (c *cluster) watchLeaders(stream string, consumers []string, since time.Time, limit time.Duration) (time.Duration, map[string]time.Duration) {
	c.t.Helper()
	streamLed := time.Duration(-1)
	led := map[string]time.Duration{}
	for first := true; ; first = false {
		now := time.Since(since)
		if first {
			now = 0
		}
		if streamLed < 0 && c.nodes.StreamLeader(stream) >= 0 {
			streamLed = now
		}
		for _, name := range consumers {
			if _, ok := led[name]; !ok && c.nodes.ConsumerLeader(stream, name) >= 0 {
				led[name] = now
			}
		}
		if streamLed >= 0 && len(led) == len(consumers) {
			return streamLed, led
		}
		if now > limit {
			c.t.Fatalf("%v after the kill: the stream led after %v (-1: not yet), %d of %d consumers led: %v", limit, streamLed, len(led), len(consumers), led)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logLevel matches a text log line's time, level and message.
var logLevel = regexp.MustCompile(`time=\S*T(\d\d:\d\d:\d\d)\S* level=(WARN|ERROR) msg=("(?:[^"\\]|\\.)*"|\S+)`)

// warnings counts the warning and error lines in p's output (since its
// last start), and the NATS client's asynchronous errors, which it prints
// itself ("nats: slow consumer, messages dropped on connection ..."), and
// names the four most frequent messages with their counts and the seconds
// of their first and last line ("?" for the client's, which have no time):
// a storm of one message under a fault is a finding of its own.
func (p *proc) warnings() (int, []string) {
	type seen struct {
		n           int
		first, last string
	}
	msgs := map[string]*seen{}
	n := 0
	for line := range strings.Lines(p.in.out.String()) {
		var key, at string
		if m := logLevel.FindStringSubmatch(line); m != nil {
			key, at = m[2]+" "+strings.Trim(m[3], `"`), m[1]
		} else if msg, ok := strings.CutPrefix(line, "nats: "); ok {
			key, _, _ = strings.Cut(strings.TrimSpace(msg), " on connection")
			key, at = "NATS "+key, "?"
		} else {
			continue
		}
		n++
		if msgs[key] == nil {
			msgs[key] = &seen{first: at}
		}
		msgs[key].n++
		msgs[key].last = at
	}
	keys := slices.Collect(maps.Keys(msgs))
	slices.SortFunc(keys, func(a, b string) int { return msgs[b].n - msgs[a].n })
	var top []string
	for _, k := range keys[:min(4, len(keys))] {
		top = append(top, fmt.Sprintf("%q x%d %s-%s", k, msgs[k].n, msgs[k].first, msgs[k].last))
	}
	return n, top
}
