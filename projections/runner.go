package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/domain"
)

// tracer records the projections' spans through the global OpenTelemetry
// provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/projections")

// inCorrelationTrace returns ctx under the trace derived from a
// correlation id (domain.TraceIDs), so a projection's spans join the trace
// of the command whose events it applies.
func inCorrelationTrace(ctx context.Context, correlationID string) context.Context {
	if correlationID == "" {
		return ctx
	}
	tid, sid := domain.TraceIDs(correlationID)
	return trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
}

// RunnerConfig tunes a Runner. Zero values take the defaults in brackets.
type RunnerConfig struct {
	Stream string // JetStream stream name
	// SubjectPrefix is the event subject space, e.g. "orders.events". The
	// stream maps each event's subject <prefix>.<stream id> to
	// <prefix>.<partition>.<stream id> (eventstore.StreamConfig.Partitions),
	// and partition p is consumed with the filter <prefix>.<p>.>.
	SubjectPrefix string
	// Partitions is how many partitions the stream splits the events into
	// [DefaultPartitions]; it must equal the stream's.
	Partitions int
	Owner      string // instance id holding partition leases [host name and pid]
	Workers    int    // pull loops per partition this process owns [2]
	BatchSize  int    // most messages folded per write round [256]
	// Writers is how many write rounds of this projection may be in
	// flight at once in this process, whatever the number of partitions it
	// owns [2]. A worker waiting for a slot keeps receiving, so its next
	// batch is larger and the events of one stream in it fold into one
	// document write: on a store with one writer (the embedded store) 16
	// partitions with a round each in flight wrote a document per event,
	// 2.4 times the writes of 2 rounds (measured on the Olist replay).
	// Raise it where the store takes parallel writes (MongoDB).
	Writers       int
	MaxDeliveries int           // deliveries of a failing event before it is parked [5]
	AckWait       time.Duration // redelivery timeout of an unacknowledged message [30s]
	LagInterval   time.Duration // consumer lag sampling [2s]
	// LeaseTTL is how long a partition lease and a member heartbeat last
	// without renewal [10s]. Leases are renewed every LeaseTTL/4, the
	// heartbeat and the rebalance run every LeaseTTL/3; an owner whose
	// renewals fail for LeaseTTL/2 stops writing, before the lease can
	// pass to another process.
	LeaseTTL time.Duration
	// OnTenure, when set, is called when this process is about to start
	// writing a partition (start true, before its first write) and when it
	// has stopped (start false, after its last), so tenures can be
	// audited.
	OnTenure func(projection string, partition int, start bool)
}

// applier is what a Runner needs of a Store, whatever its document type.
type applier interface {
	apply(ctx context.Context, events []domain.Event, fresh bool) (Outcome, map[string]error, error)
	EnsureIndexes(ctx context.Context) error
	purge()
}

// Runner feeds one projection from JetStream, split into partitions by
// stream id: partition p has its own durable pull consumer,
// "proj_<name>_p<NN>", and is consumed by exactly one process at a time,
// the holder of its lease in PartitionsCollection. This is the model of
// Axon's tracking-processor segments and of Kafka's consumer groups: every
// process running the projection heartbeats in MembersCollection, the
// live members share the partitions evenly (fairShare, Kafka's range
// assignment over the members sorted by id), a member above its share
// releases partitions when another joins, and a member below it claims
// free or expired ones when another leaves or dies. Events of one stream
// stay in one partition, so in order, and gap fills are rare.
//
// A deposed owner stops writing before its successor starts: a release
// comes after the partition's workers have stopped, and an owner whose
// renewals fail stops after LeaseTTL/2, while a successor can claim only
// after LeaseTTL. A write that was already on its way when the owner
// stopped lands late: the version guard makes it harmless (invariant 4).
//
// Within a partition, each worker takes the messages at hand (up to
// BatchSize), folds them with one read and one bulk write per round, and
// acknowledges a message only once its stream's document reflects it.
// Events that cannot be applied are redelivered with backoff and, after
// MaxDeliveries, parked in the dead-letter collection and terminated;
// failures that may pass (store down) are redelivered without limit.
type Runner struct {
	name    string
	store   applier
	js      jetstream.JetStream
	dead    *DeadLetters
	table   *partitionTable
	cfg     RunnerConfig
	log     *slog.Logger
	metrics *Metrics
	lastErr atomic.Pointer[string]
	writers chan struct{} // a slot per write round in flight (Writers)

	// Run's goroutine changes owned, under mu; renewLoop reads it under
	// mu. The other fields are Run's goroutine's only.
	mu     sync.Mutex
	owned  map[int]*tenure
	joined bool      // heartbeating as a member
	busOK  time.Time // last time JetStream answered
	failed chan error
}

// tenure is this process's hold on one partition, from its claim until
// its workers have stopped.
type tenure struct {
	p      int
	ctx    context.Context // the workers'; done once the partition stops
	cancel context.CancelFunc
	done   chan struct{}
	// fence cancels the workers LeaseTTL/2 after the last successful
	// renewal was sent; each renewal pushes it back.
	fence   *time.Timer
	taken   atomic.Bool // the lease passed to another owner
	applied atomic.Int64
	// The apply counter at the previous heartbeat, for the rate.
	ratedApplied int64
	ratedAt      time.Time
}

// stats returns what this process applied in each partition it holds
// since its claim, and per second since the previous call.
func (r *Runner) stats() []partitionStat {
	now := time.Now()
	var out []partitionStat
	for _, p := range r.ownedPartitions() {
		tn := r.tenure(p)
		st := partitionStat{Partition: p, Applied: tn.applied.Load()}
		if d := now.Sub(tn.ratedAt).Seconds(); d > 0 {
			st.Rate = float64(st.Applied-tn.ratedApplied) / d
		}
		tn.ratedApplied, tn.ratedAt = st.Applied, now
		out = append(out, st)
	}
	return out
}

// LastError is the last failure of this process's workers: a batch that
// could not be written, or an event parked; "" when there was none.
func (r *Runner) LastError() string {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

func (r *Runner) setLastError(err error) {
	msg := err.Error()
	r.lastErr.Store(&msg)
}

// NewRunner returns a Runner feeding the projection p; its partition
// leases and members live in p's database.
func NewRunner[D any](p *Projection[D], js jetstream.JetStream, dead *DeadLetters, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	cfg.setDefaults()
	return &Runner{name: p.def.Name, store: p, js: js, dead: dead, cfg: cfg, log: log.With("projection", p.def.Name), metrics: m,
		table: newPartitionTable(p.db, p.def.Name, cfg.Owner, cfg.LeaseTTL), writers: make(chan struct{}, cfg.Writers)}
}

func (c *RunnerConfig) setDefaults() {
	if c.Partitions <= 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.Writers <= 0 {
		c.Writers = 2
	}
	if c.MaxDeliveries <= 0 {
		c.MaxDeliveries = 5
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.LagInterval <= 0 {
		c.LagInterval = 2 * time.Second
	}
}

// Name is the projection's name.
func (r *Runner) Name() string { return r.name }

// Partitions is the number of partitions.
func (r *Runner) Partitions() int { return r.cfg.Partitions }

// ConsumerName is the durable consumer of partition p: "proj_<name>_p<NN>".
func (r *Runner) ConsumerName(p int) string { return fmt.Sprintf("proj_%s_p%02d", r.name, p) }

// FilterSubject is the subject filter of partition p: "<prefix>.<p>.>".
func (r *Runner) FilterSubject(p int) string { return fmt.Sprintf("%s.%d.>", r.cfg.SubjectPrefix, p) }

// Consumer creates or updates the durable consumer of partition p and
// returns it.
func (r *Runner) Consumer(ctx context.Context, p int) (jetstream.Consumer, error) {
	c, err := r.js.CreateOrUpdateConsumer(ctx, r.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       r.ConsumerName(p),
		FilterSubject: r.FilterSubject(p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    -1,
		MaxAckPending: 4 * r.cfg.Workers * r.cfg.BatchSize,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", r.ConsumerName(p), err)
	}
	return c, nil
}

// Run ensures the indexes, the partitions' lease documents and consumers,
// then joins the projection's members and consumes the partitions this
// process is given, rebalancing every LeaseTTL/3, until ctx is done; then
// it stops its workers, releases its partitions and leaves. It returns nil
// on cancellation, and the error of a partition's consumer that could not
// run (the caller restarts it).
func (r *Runner) Run(ctx context.Context) error {
	if err := r.store.EnsureIndexes(ctx); err != nil {
		return err
	}
	if err := r.table.ensure(ctx, r.cfg.Partitions); err != nil {
		return err
	}
	for p := range r.cfg.Partitions {
		if _, err := r.Consumer(ctx, p); err != nil {
			return err
		}
	}
	r.metrics.initProjection(r.name)
	r.owned, r.joined, r.failed = map[int]*tenure{}, false, make(chan error, r.cfg.Partitions)
	defer r.leave(context.WithoutCancel(ctx), true)
	// Renewals run on their own, so that the fences never wait for a
	// slow rebalance.
	rctx, stopRenewing := context.WithCancel(ctx)
	var renewing sync.WaitGroup
	renewing.Go(func() { r.renewLoop(rctx) })
	defer renewing.Wait()
	defer stopRenewing()
	balance := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer balance.Stop()
	sample := time.NewTicker(r.cfg.LagInterval)
	defer sample.Stop()
	for {
		r.step(ctx)
		r.sample(ctx)
		for wait := true; wait; {
			select {
			case <-ctx.Done():
				return nil
			case err := <-r.failed:
				return err
			case <-sample.C:
				r.sample(ctx)
			case <-balance.C:
				wait = false
			}
		}
	}
}

// step heartbeats, and releases or claims partitions to reach this
// member's share.
func (r *Runner) step(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	if err := r.busReachable(ctx); err == nil {
		r.busOK = time.Now()
	} else if ctx.Err() == nil {
		if r.joined && time.Since(r.busOK) <= ttl/2 {
			r.log.Warn("projection bus unreachable; keeping the partitions for now", "err", err)
		} else {
			// An owner that cannot pull would keep its partitions and
			// apply nothing: leave them to a member that can.
			if r.joined {
				r.log.Warn("projection partitions released: the bus is unreachable", "err", err, "partitions", len(r.owned))
				r.leave(ctx, true)
			} else {
				r.log.Warn("projection partitions not claimed: the bus is unreachable", "err", err)
			}
			return
		}
	}

	// Partitions fenced off (renewals failing) or taken by another owner
	// have had their workers cancelled: wait for them.
	for _, p := range r.ownedPartitions() {
		if tn := r.tenure(p); tn.fenced() {
			r.log.Warn("projection partition lease lost: stopping its workers", "partition", p, "taken_by_another", tn.taken.Load())
			r.stop(p)
		}
	}

	// Heartbeat, then compare what is held with this member's share.
	if _, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) { return true, r.table.heartbeat(ctx, r.stats()) }); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection heartbeat failed", "err", err)
		}
		return
	}
	r.joined = true
	var live []memberDoc
	var leases []partitionDoc
	_, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) {
		var err error
		if live, err = r.table.live(ctx); err != nil {
			return false, err
		}
		leases, err = r.table.list(ctx)
		return err == nil, err
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection partitions not read", "err", err)
		}
		return
	}
	var members []string
	for _, m := range live {
		members = append(members, m.Owner)
	}
	if !slices.Contains(members, r.cfg.Owner) {
		members = append(members, r.cfg.Owner)
		slices.Sort(members)
	}
	me := slices.Index(members, r.cfg.Owner)
	share := fairShare(r.cfg.Partitions, len(members), me)

	// Above the share (a member joined): release the highest partitions,
	// each once its workers have stopped.
	for len(r.owned) > share {
		p := slices.Max(slices.Collect(maps.Keys(r.owned)))
		r.stop(p)
		if _, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) { return true, r.table.release(ctx, p) }); err != nil {
			r.log.Warn("projection partition release failed; it expires instead", "partition", p, "err", err)
		}
		r.log.Info("projection partition released to rebalance", "partition", p, "members", len(members), "share", share)
	}
	// Below it (a member left or died): claim free and expired
	// partitions, starting at this member's place in the ring so that
	// claimants rarely race for the same one.
	now := time.Now()
	began := now
	for i := range leases {
		if len(r.owned) >= share || time.Since(began) > ttl/2 || ctx.Err() != nil {
			break
		}
		d := leases[(i+me*len(leases)/len(members))%len(leases)]
		if _, held := r.owned[d.Partition]; held || d.Partition >= r.cfg.Partitions {
			continue
		}
		if d.ExpiresAt.After(now) && d.Owner != r.cfg.Owner {
			continue
		}
		at := time.Now()
		ok, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) { return r.table.claim(ctx, d.Partition, at) })
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("projection partition claim failed", "partition", d.Partition, "err", err)
			}
			return
		}
		if ok {
			r.start(ctx, d.Partition, at)
		}
	}
	r.metrics.setOwned(r.name, len(r.owned))
}

// start runs the workers of partition p, just claimed at claimedAt.
func (r *Runner) start(ctx context.Context, p int, claimedAt time.Time) {
	// Another owner may have written this partition's documents since
	// this process last did.
	r.store.purge()
	pctx, cancel := context.WithCancel(ctx)
	tn := &tenure{p: p, ctx: pctx, cancel: cancel, done: make(chan struct{}), ratedAt: claimedAt,
		fence: time.AfterFunc(time.Until(claimedAt.Add(r.cfg.LeaseTTL/2)), cancel)}
	r.mu.Lock()
	r.owned[p] = tn
	r.mu.Unlock()
	if r.cfg.OnTenure != nil {
		r.cfg.OnTenure(r.name, p, true)
	}
	r.log.Info("projection partition claimed: consuming", "partition", p)
	go func() {
		defer close(tn.done)
		if err := r.consume(pctx, tn); err != nil && pctx.Err() == nil {
			r.failed <- err
		}
		// Every worker has returned: nothing more is written.
		if r.cfg.OnTenure != nil {
			r.cfg.OnTenure(r.name, p, false)
		}
	}()
}

// stop cancels partition p's workers and waits until they have returned:
// once stop returns, this process writes nothing more for p.
func (r *Runner) stop(p int) {
	tn := r.owned[p]
	if tn == nil {
		return
	}
	tn.fence.Stop()
	tn.cancel()
	<-tn.done
	r.mu.Lock()
	delete(r.owned, p)
	r.mu.Unlock()
	r.metrics.dropPartition(r.name, p)
	r.metrics.setOwned(r.name, len(r.owned))
}

// leave stops every partition's workers and, with release, frees the
// partitions and removes this member, each bounded by two seconds.
func (r *Runner) leave(ctx context.Context, release bool) {
	for _, p := range slices.Sorted(maps.Keys(r.owned)) {
		r.stop(p)
		if release {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := r.table.release(rctx, p); err != nil {
				r.log.Warn("projection partition release failed; it expires instead", "partition", p, "err", err)
			}
			cancel()
		}
	}
	if r.joined {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := r.table.leave(rctx); err != nil {
			r.log.Warn("projection member not removed; its heartbeat expires instead", "err", err)
		}
		cancel()
		r.joined = false
	}
}

// ownedPartitions returns the partitions this process holds, sorted.
func (r *Runner) ownedPartitions() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.owned))
}

func (r *Runner) tenure(p int) *tenure {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[p]
}

// renewLoop renews every LeaseTTL/4 the leases of the partitions held,
// in one update, each renewal pushing back its partition's fence. A
// partition whose lease is found in another owner's hands has its workers
// cancelled at once (step then waits for them); one whose renewals keep
// failing is cancelled by its fence LeaseTTL/2 after the last renewal that
// got through, before a successor can claim it at LeaseTTL.
func (r *Runner) renewLoop(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	t := time.NewTicker(ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		held := map[int]*tenure{}
		for p, tn := range r.owned {
			if !tn.fenced() {
				held[p] = tn
			}
		}
		r.mu.Unlock()
		if len(held) == 0 {
			continue
		}
		at := time.Now()
		ok, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) {
			kept, err := r.table.renew(ctx, slices.Collect(maps.Keys(held)), at)
			for _, p := range kept {
				if tn := held[p]; tn.fence.Stop() { // not fired: the new deadline holds
					tn.fence.Reset(time.Until(at.Add(ttl / 2)))
				}
				delete(held, p)
			}
			return err == nil, err
		})
		switch {
		case ok:
			for _, tn := range held { // not renewed: another owner's now
				tn.taken.Store(true)
				tn.cancel()
			}
		case ctx.Err() == nil:
			r.log.Warn("projection partition renewal failed", "partitions", len(held), "err", err)
		}
	}
}

// fenced reports whether the partition's fence has stopped its workers.
func (tn *tenure) fenced() bool { return tn.ctx.Err() != nil }

// bounded runs f with a deadline d from now, and lets it finish when ctx
// is cancelled: a lease write cut off mid-flight may still land on the
// server after the release that shutdown sends next, and hold a
// partition or a member place for a whole TTL.
func bounded(ctx context.Context, d time.Duration, f func(context.Context) (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return f(ctx)
}

// busReachable makes one JetStream API round trip, bounded by a quarter
// of the lease.
func (r *Runner) busReachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/4)
	defer cancel()
	if _, err := r.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream account info: %w", err)
	}
	return nil
}

// consume runs the workers of one partition until ctx is done.
func (r *Runner) consume(ctx context.Context, tn *tenure) error {
	cons, err := r.Consumer(ctx, tn.p)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for i := 0; i < r.cfg.Workers; i++ {
		g.Go(func() error { return r.work(ctx, cons, tn) })
	}
	return g.Wait()
}

// work pulls continuously; the first message of a batch is waited for,
// then a write slot (Writers), and the rest are whatever is buffered by
// then, so a batch costs no extra latency at low load and grows to
// BatchSize under load. When ctx is done, the
// messages pulled and not handled are given back (Nak), so the
// partition's next owner gets them at once rather than after AckWait.
func (r *Runner) work(ctx context.Context, cons jetstream.Consumer, tn *tenure) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * r.cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.ConsumerName(tn.p), err)
	}
	defer it.Stop()
	defer func() {
		it.Drain()
		for range 4 * r.cfg.BatchSize {
			m, err := it.Next(jetstream.NextMaxWait(100 * time.Millisecond))
			if err != nil {
				return
			}
			_ = m.Nak()
		}
	}()
	for ctx.Err() == nil {
		first, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return fmt.Errorf("consume %s: %w", r.ConsumerName(tn.p), err)
			}
			r.log.Warn("projection pull failed", "partition", tn.p, "err", err)
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		select {
		case r.writers <- struct{}{}:
		case <-ctx.Done():
			_ = first.Nak()
			return nil
		}
		batch := []jetstream.Msg{first}
		for len(batch) < r.cfg.BatchSize {
			m, err := it.Next(jetstream.NextMaxWait(500 * time.Microsecond))
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
		r.handle(ctx, tn, batch)
		<-r.writers
	}
	return nil
}

// handle folds one batch of partition tn's messages and acknowledges,
// redelivers or parks each of them.
func (r *Runner) handle(ctx context.Context, tn *tenure, msgs []jetstream.Msg) {
	type received struct {
		msg     jetstream.Msg
		version int64 // 0 when the message does not decode
		span    trace.Span
	}
	events := make([]domain.Event, 0, len(msgs))
	byStream := map[string][]received{}
	poison := map[string]error{}
	fresh := false // a redelivery reads the documents instead of the cache
	for _, m := range msgs {
		if md, err := m.Metadata(); err != nil || md.NumDelivered > 1 {
			fresh = true
		}
		e, err := domain.UnmarshalEvent(m.Data())
		stream := e.StreamID
		if err != nil {
			stream = subjectStream(m.Subject())
			poison[stream] = errors.Join(poison[stream], err)
		} else {
			events = append(events, e)
		}
		_, span := tracer.Start(inCorrelationTrace(ctx, e.Metadata.CorrelationID), "projection.apply",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
				attribute.String("orderd.projection", r.name), attribute.String("orderd.stream_id", stream),
				attribute.Int64("orderd.version", e.Version), attribute.String("orderd.event_type", e.Type),
				attribute.String("orderd.correlation_id", e.Metadata.CorrelationID)))
		byStream[stream] = append(byStream[stream], received{m, e.Version, span})
	}
	defer func() {
		for _, ms := range byStream {
			for _, m := range ms {
				m.span.End()
			}
		}
	}()
	out, failed, err := r.store.apply(ctx, events, fresh)
	tn.applied.Add(int64(out.Applied))
	r.metrics.partitionApplied(r.name, tn.p, out.Applied)
	if err != nil {
		// Nothing is known to be written: redeliver everything soon,
		// without counting it against the dead-letter limit.
		if ctx.Err() != nil {
			// The partition stops: its next owner gets them at once.
			for _, m := range msgs {
				_ = m.Nak()
			}
			return
		}
		r.metrics.failed(r.name)
		r.setLastError(err)
		r.log.Warn("projection batch failed", "err", err, "messages", len(msgs))
		for _, ms := range byStream {
			for _, m := range ms {
				m.span.SetStatus(codes.Error, err.Error())
			}
		}
		for _, m := range msgs {
			_ = m.NakWithDelay(time.Second)
		}
		return
	}
	for stream, ms := range byStream {
		// Events the document reflects are done, even in a stream with a
		// message that does not decode or an event that does not apply.
		applyErr := failed[stream]
		reached := int64(math.MaxInt64)
		if applyErr != nil {
			reached = 0
			var pe *PoisonError
			if errors.As(applyErr, &pe) {
				reached = pe.Reached
			}
		}
		for _, m := range ms {
			if m.version > 0 && m.version <= reached {
				_ = m.msg.Ack()
				continue
			}
			cause := errors.Join(poison[stream], applyErr)
			m.span.SetStatus(codes.Error, cause.Error())
			r.reject(ctx, m.msg, stream, cause)
		}
	}
}

// reject redelivers a message whose event could not be applied, with
// backoff, or parks it once it was delivered MaxDeliveries times.
func (r *Runner) reject(ctx context.Context, m jetstream.Msg, stream string, cause error) {
	md, err := m.Metadata()
	if err != nil {
		_ = m.NakWithDelay(time.Second)
		return
	}
	if md.NumDelivered < uint64(r.cfg.MaxDeliveries) {
		_ = m.NakWithDelay(min(time.Duration(md.NumDelivered)*200*time.Millisecond, 5*time.Second))
		return
	}
	d := DeadLetter{
		Projection: r.name, StreamID: stream, Subject: m.Subject(), Payload: string(m.Data()),
		Error: cause.Error(), Deliveries: md.NumDelivered, ParkedAt: time.Now().UTC(), StreamSeq: md.Sequence.Stream,
	}
	if e, err := domain.UnmarshalEvent(m.Data()); err == nil {
		d.EventID, d.Version = e.ID, e.Version
	}
	d.ID = r.name + ":" + d.EventID
	if d.EventID == "" {
		d.ID = fmt.Sprintf("%s:seq-%d", r.name, md.Sequence.Stream)
	}
	if err := r.dead.Park(ctx, d); err != nil {
		r.log.Warn("dead letter not parked; redelivering", "err", err, "stream_id", stream)
		_ = m.NakWithDelay(time.Second)
		return
	}
	r.metrics.deadLetter(r.name)
	r.setLastError(cause)
	r.log.Error("event parked in dead letters", "stream_id", stream, "event_id", d.EventID, "version", d.Version,
		"correlation_id", correlationOf(m.Data()), "err", cause)
	_ = m.Term()
}

// Retry re-applies a dead letter of this projection (see DeadLetters.Retry).
func (r *Runner) Retry(ctx context.Context, id string) error {
	if !strings.HasPrefix(id, r.name+":") {
		return fmt.Errorf("dead letter %s of projection %s: %w", id, r.name, domain.ErrNotFound)
	}
	return r.dead.Retry(ctx, id, func(ctx context.Context, evs []domain.Event) error {
		_, failed, err := r.store.apply(ctx, evs, true)
		for _, e := range failed {
			err = errors.Join(err, e)
		}
		return err
	})
}

// Lag returns the number of messages the partitions' consumers have not
// acknowledged, summed over every partition.
func (r *Runner) Lag(ctx context.Context) (uint64, error) {
	var n uint64
	for p := range r.cfg.Partitions {
		l, err := r.PartitionLag(ctx, p)
		if err != nil {
			return 0, err
		}
		n += l
	}
	return n, nil
}

// PartitionLag returns the number of messages partition p's consumer has
// not acknowledged: pending plus in flight.
func (r *Runner) PartitionLag(ctx context.Context, p int) (uint64, error) {
	c, err := r.js.Consumer(ctx, r.cfg.Stream, r.ConsumerName(p))
	if err != nil {
		return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(p), err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(p), err)
	}
	return info.NumPending + uint64(info.NumAckPending), nil
}

// AckFloor returns how many deliveries the projection's consumers have
// acknowledged, summed over its partitions (each consumer's ack floor in
// its own sequence): its change over time is the rate at which the
// projection applies events, whichever processes apply them.
func (r *Runner) AckFloor(ctx context.Context) (uint64, error) {
	var n uint64
	for p := range r.cfg.Partitions {
		c, err := r.js.Consumer(ctx, r.cfg.Stream, r.ConsumerName(p))
		if err != nil {
			return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(p), err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(p), err)
		}
		n += info.AckFloor.Consumer
	}
	return n, nil
}

// PartitionStatus returns every partition of the projection: its owner
// ("" when free or expired), lease deadline and tenure from the lease
// documents, the events applied and the apply rate its owner reported at
// its last heartbeat, and, with lag, its consumer's lag (nil when
// JetStream does not answer).
func (r *Runner) PartitionStatus(ctx context.Context, lag bool) ([]PartitionStatus, error) {
	docs, err := r.table.list(ctx)
	if err != nil {
		return nil, err
	}
	members, err := r.table.live(ctx)
	if err != nil {
		return nil, err
	}
	byPart := map[int]partitionDoc{}
	for _, d := range docs {
		byPart[d.Partition] = d
	}
	reported := map[string]partitionStat{} // owner/partition
	for _, m := range members {
		for _, st := range m.Partitions {
			reported[fmt.Sprintf("%s/%d", m.Owner, st.Partition)] = st
		}
	}
	now := time.Now()
	out := make([]PartitionStatus, 0, r.cfg.Partitions)
	for p := range r.cfg.Partitions {
		st := PartitionStatus{Partition: p, Consumer: r.ConsumerName(p)}
		if d, ok := byPart[p]; ok && d.ExpiresAt.After(now) && d.Owner != "" {
			st.Owner, st.LeaseUntil, st.Epoch = d.Owner, d.ExpiresAt, d.Epoch
			if rep, ok := reported[fmt.Sprintf("%s/%d", d.Owner, p)]; ok {
				st.Applied, st.ApplyRate = rep.Applied, rep.Rate
			}
		}
		if lag {
			if n, err := r.PartitionLag(ctx, p); err == nil {
				st.Lag = &n
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// sample samples the lag of the partitions this process owns and the
// number of dead letters parked, into the metrics.
func (r *Runner) sample(ctx context.Context) {
	if r.metrics == nil {
		return
	}
	var total int64
	sctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/4)
	defer cancel()
	for p := range r.owned {
		if n, err := r.PartitionLag(sctx, p); err == nil {
			r.metrics.setPartitionLag(r.name, p, float64(n))
			total += int64(n)
		}
	}
	r.metrics.setLag(r.name, float64(total))
	// The dead letters parked now: one count of a small collection.
	if r.dead != nil {
		if n, err := r.dead.Count(ctx, r.name); err == nil {
			r.metrics.setDeadLetters(r.name, float64(n))
		}
	}
}

// correlationOf is the correlation id of an event's message, or "" when
// it does not decode.
func correlationOf(data []byte) string {
	e, err := domain.UnmarshalEvent(data)
	if err != nil {
		return ""
	}
	return e.Metadata.CorrelationID
}

// subjectStream is the last token of an event subject: the stream id.
func subjectStream(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
