package projector

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/tracing"
)

// partition is this process's side of one partition: whether it pulls it,
// the pin JetStream last gave it, and what it applied.
type partition struct {
	p       int
	pin     atomic.Pointer[string] // Nats-Pin-Id of the last message received; "" before any
	applied atomic.Int64

	mu      sync.Mutex
	pulling bool          // pull, to hold the partition or to be given it
	unpin   bool          // released: unpin it once its worker has stopped
	changed chan struct{} // closed and replaced when pulling changes
	// The apply counter at the previous report, for the rate.
	ratedApplied int64
	ratedAt      time.Time
}

func newPartition(p int) *partition {
	pt := &partition{p: p, pulling: true, changed: make(chan struct{}), ratedAt: time.Now()}
	empty := ""
	pt.pin.Store(&empty)
	return pt
}

// wanted returns whether the partition is pulled, and a channel closed
// when that changes.
func (pt *partition) wanted() (bool, <-chan struct{}) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.pulling, pt.changed
}

// setPulling starts or stops pulling the partition.
func (pt *partition) setPulling(on bool) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.pulling != on {
		pt.pulling = on
		close(pt.changed)
		pt.changed = make(chan struct{})
	}
}

// lastPin is the pin id JetStream gave this process's pulls last.
func (pt *partition) lastPin() string { return *pt.pin.Load() }

// rate returns what this process applied in the partition and per second
// since the previous call.
func (pt *partition) rate(now time.Time) (applied int64, rate float64) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	applied = pt.applied.Load()
	if d := now.Sub(pt.ratedAt).Seconds(); d > 0 {
		rate = float64(applied-pt.ratedApplied) / d
	}
	pt.ratedApplied, pt.ratedAt = applied, now
	return applied, rate
}

// consumePartition pulls partition pt while it is wanted, until ctx is
// done. When its pulls fail (the consumer was deleted, the iterator
// closed) they start again after a backoff: one partition's trouble stays
// that partition's.
func (r *Runner) consumePartition(ctx context.Context, pt *partition, cons jetstream.Consumer) {
	var backoff time.Duration
	for ctx.Err() == nil {
		on, changed := pt.wanted()
		if !on {
			select {
			case <-ctx.Done():
			case <-changed:
			}
			continue
		}
		pctx, stop := context.WithCancel(ctx)
		go func() {
			select {
			case <-changed:
			case <-pctx.Done():
			}
			stop()
		}()
		began := time.Now()
		err := r.pull(ctx, pctx, pt, cons)
		stop()
		if pt.takeUnpin() && ctx.Err() == nil {
			r.unpin(ctx, pt.p)
		}
		if ctx.Err() != nil || err == nil {
			continue
		}
		if time.Since(began) > r.cfg.PinnedTTL {
			backoff = 0 // it ran a while: a new failure, not the same one
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), r.cfg.PinnedTTL/4)
		r.setLastError(err)
		r.log.Warn("projection partition consumer failed; restarting it", "partition", pt.p, "err", err, "retry_in", backoff)
		pause.For(ctx, backoff)
		// The consumer may have been deleted (a version retired, an
		// operator): look it up, or create it, again.
		if c, err := r.consumer(ctx, pt.p); err == nil {
			cons = c
		}
	}
}

// pullExpiry is how long a pull request waits at the consumer's leader:
// an idle puller sends the next one when it expires, and that request is
// what keeps the partition pinned to it, so it comes every PinnedTTL/4.
// pullHeartbeat is how often the leader tells an idle puller that it is
// there: a puller that misses two heartbeats pulls again, and so finds
// the consumer's new leader soon after a crash elected it; with the
// client's defaults, 30 s and 5 s, a partition stalled for the whole pull
// (docs/benchmarks.md, "Why a partition's puller hears from its
// consumer's leader every second").
// (The client takes no expiry under a second.)
func (r *Runner) pullExpiry() time.Duration { return max(r.cfg.PinnedTTL/4, time.Second) }

const pullHeartbeat = time.Second

// pinIDHeader carries the pin JetStream gave the pull a message answers.
const pinIDHeader = "Nats-Pin-Id"

// batchLinger is how long a batch waits for one more message already on
// its way once none is at hand: a batch forms only of what has arrived.
const batchLinger = 200 * time.Microsecond

// drainWait bounds how long a partition that stops pulling waits for the
// messages its client still holds, to give them back.
const drainWait = time.Second

// pull consumes partition pt until pctx is done (the partition is no
// longer wanted, or ctx is done): the first message of a batch is waited
// for, then what arrives within batchLinger, then a write round (write),
// which adds what arrived meanwhile, so a batch costs no extra latency at
// low load and grows to BatchSize under load. When it stops, the messages
// received and not handled are given back (Nak), so the partition's next
// holder gets them at once rather than after AckWait. ctx bounds the
// writes: a batch handed to a write round when pctx ends is written.
//
// A pump moves each message out of the client's buffer as it arrives:
// the client drops what arrives while its buffer is full ("slow
// consumer", back only after AckWait), and it pulls again only when it is
// read, so a buffer left full while a batch is written overflows after a
// reconnect (TestRunnerLosesNoMessageWhenItsBusLinkIsCut saw six drops
// without the pump) and sends no pull request that keeps the pin. The
// consumer's MaxAckPending bounds what the pump can hold.
func (r *Runner) pull(ctx, pctx context.Context, pt *partition, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullPriorityGroup(pinGroup), jetstream.PullMaxMessages(r.cfg.BatchSize),
		jetstream.PullExpiry(r.pullExpiry()), jetstream.PullHeartbeat(min(pullHeartbeat, r.pullExpiry()/2)))
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.ConsumerName(pt.p), err)
	}
	// Room for what MaxAckPending lets JetStream deliver, and as much
	// again for the copies it redelivers after AckWait while a write
	// stalls.
	msgs := make(chan arrival, 2*maxAckPending(r.cfg.BatchSize))
	var pumpErr error
	go func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				pumpErr = err
				return
			}
			msgs <- arrival{m, pt, time.Now()}
		}
	}()
	defer func() {
		it.Drain()
		stop := time.AfterFunc(drainWait, it.Stop)
		for a := range msgs {
			_ = a.msg.Nak()
		}
		stop.Stop()
	}()
	for {
		var first arrival
		select {
		case m, ok := <-msgs:
			if !ok {
				if pctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("consume %s: %w", r.ConsumerName(pt.p), pumpErr)
			}
			first = m
		case <-pctx.Done():
			return nil
		}
		batch := []arrival{first}
		linger := time.NewTimer(batchLinger)
	fill:
		for len(batch) < r.cfg.BatchSize {
			select {
			case m, ok := <-msgs:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			case <-linger.C:
				break fill
			}
		}
		linger.Stop()
		r.write(ctx, &waiting{pt: pt, batch: batch, more: msgs, done: make(chan struct{})})
	}
}

// waiting is a partition's batch waiting for a write round. The round
// that takes it adds what has arrived on more since, up to BatchSize, and
// closes done once the batch is handled.
type waiting struct {
	pt    *partition
	batch []arrival
	more  <-chan arrival
	done  chan struct{}
}

// write hands w to a write round and returns once it is handled. A
// partition that gets one of the Writers slots writes, in one round,
// every batch waiting then, its own or not: on a store with one writer,
// 16 partitions taking turns in 2 slots waited 100 ms for a slot, each
// writing its own 14 messages (BenchmarkService, docs/benchmarks.md, "Why
// two write rounds of a projection in flight, shared by its partitions").
// Events of one stream are in one partition, whose batches are written
// one after another, so a round holds at most one batch of a stream. A
// round starts no sooner than r.spacing after the one before
// (sequencedSpacing).
func (r *Runner) write(ctx context.Context, w *waiting) {
	r.mu.Lock()
	r.waiting = append(r.waiting, w)
	r.mu.Unlock()
	for {
		select {
		case <-w.done:
			return
		case r.writers <- struct{}{}:
		}
		r.mu.Lock()
		if wait := time.Until(r.began.Add(r.spacing)); wait > 0 {
			r.mu.Unlock()
			pause.For(ctx, wait)
			r.mu.Lock()
		}
		round := r.waiting
		r.waiting = nil
		r.began = time.Now()
		r.mu.Unlock()
		for _, w := range round {
		more:
			for len(w.batch) < r.cfg.BatchSize {
				select {
				case m, ok := <-w.more:
					if !ok {
						break more
					}
					w.batch = append(w.batch, m)
				default:
					break more
				}
			}
		}
		if len(round) == 0 { // a round of another partition took w
			<-r.writers
			<-w.done
			return
		}
		r.handle(ctx, round)
		for _, w := range round {
			close(w.done)
		}
		<-r.writers
	}
}

// sequencedSpacing is the least time between the starts of two write
// rounds of a Sequenced projection (the daily sales rollup): its rounds
// fold whatever arrived meanwhile into a few day documents, so spaced
// rounds write the same sums with fewer statements. On the embedded
// store's one writer, rounds back to back took 15-17 % of the writer in
// BenchmarkService (163-169 rounds for 3000 commands); 100 ms apart, 3-5 %
// (31-36 rounds), and commands/s rose from 968-1052 to 1083-1193 with the
// summaries as fresh as before (docs/benchmarks.md, "Why the daily sales
// rollup writes at most every 100 ms"). Its readers see a sale up to this
// much later.
const sequencedSpacing = 100 * time.Millisecond

// arrival is a message, the partition it was received in and when this
// process received it.
type arrival struct {
	msg jetstream.Msg
	pt  *partition
	at  time.Time
}

// handle folds the batches of one write round and acknowledges,
// redelivers or parks each of their messages.
func (r *Runner) handle(ctx context.Context, round []*waiting) {
	var (
		msgs  []arrival
		fresh bool
	)
	for _, w := range round {
		// A redelivery, or the first batch of a pin this process was
		// just given, reads the documents instead of the cache: another
		// process may have written them since.
		if pin := w.batch[0].msg.Headers().Get(pinIDHeader); pin != "" && pin != w.pt.lastPin() {
			w.pt.pin.Store(&pin)
			fresh = true
		}
		if r.seq != nil {
			// A rollup reads its cursor again before it calls anything a
			// gap. It has one partition.
			r.handleSequenced(ctx, w.pt, w.batch)
			continue
		}
		msgs = append(msgs, w.batch...)
	}
	if len(msgs) == 0 {
		return
	}
	type received struct {
		msg     jetstream.Msg
		pt      *partition
		version int64 // 0 when the message does not decode
		span    trace.Span
	}
	events := make([]domain.Event, 0, len(msgs))
	arrived := make([]time.Time, 0, len(msgs)) // of each of events
	byStream := map[string][]received{}
	poison := map[string]error{}
	for _, a := range msgs {
		m := a.msg
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
			arrived = append(arrived, a.at)
		}
		_, span := tracer.Start(tracing.InCorrelationTrace(ctx, e.Metadata.CorrelationID), "projection.apply",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
				attribute.String("orderd.projection", r.name), attribute.String("orderd.stream_id", stream),
				attribute.Int64("orderd.version", e.Version), attribute.String("orderd.event_type", e.Type),
				attribute.String("orderd.correlation_id", e.Metadata.CorrelationID)))
		byStream[stream] = append(byStream[stream], received{m, a.pt, e.Version, span})
	}
	defer func() {
		for _, ms := range byStream {
			for _, m := range ms {
				m.span.End()
			}
		}
	}()
	wctx, done := r.writeContext(ctx)
	_, failed, err := r.store.Apply(wctx, events, fresh)
	done()
	if err != nil {
		for _, ms := range byStream {
			for _, m := range ms {
				m.span.SetStatus(codes.Error, err.Error())
			}
		}
		r.redeliver(ctx, msgs, err)
		return
	}
	r.metrics.observeAges(r.name, events, arrived)
	for stream, ms := range byStream {
		// Events the document reflects are done, even in a stream with a
		// message that does not decode or an event that does not apply.
		applyErr := failed[stream]
		reached := int64(math.MaxInt64)
		if applyErr != nil {
			reached = 0
			var pe *projection.PoisonError
			if errors.As(applyErr, &pe) {
				reached = pe.Reached
			}
		}
		for _, m := range ms {
			if m.version > 0 && m.version <= reached {
				_ = m.msg.Ack()
				m.pt.applied.Add(1)
				r.metrics.partitionApplied(r.name, m.pt.p, 1)
				continue
			}
			cause := errors.Join(poison[stream], applyErr)
			m.span.SetStatus(codes.Error, cause.Error())
			r.reject(ctx, m.msg, stream, cause)
		}
	}
}

// redeliver has JetStream deliver msgs again in a second, not counted
// against the dead-letter limit: nothing of their batch is known to be
// written, for err (counted and logged unless ctx is done), or because
// one of them could not be parked (err nil).
func (r *Runner) redeliver(ctx context.Context, msgs []arrival, err error) {
	if err != nil && ctx.Err() == nil {
		r.metrics.errors.WithLabelValues(r.name).Inc()
		r.setLastError(err)
		r.log.Warn("projection batch failed", "err", err, "messages", len(msgs))
	}
	for _, m := range msgs {
		_ = m.msg.NakWithDelay(time.Second)
	}
}

// reject redelivers a message whose event could not be applied, with
// backoff, or parks it once it was delivered MaxDeliveries times.
func (r *Runner) reject(ctx context.Context, m jetstream.Msg, stream string, cause error) {
	md, err := m.Metadata()
	switch {
	case err != nil:
		_ = m.NakWithDelay(time.Second)
	case md.NumDelivered < uint64(r.cfg.MaxDeliveries):
		_ = m.NakWithDelay(min(time.Duration(md.NumDelivered)*200*time.Millisecond, 5*time.Second))
	case !r.park(ctx, m, stream, cause):
		_ = m.NakWithDelay(time.Second)
	default:
		_ = m.Term()
	}
}

// park records m, which cannot be applied for cause, in the dead
// letters, and reports whether it could.
func (r *Runner) park(ctx context.Context, m jetstream.Msg, stream string, cause error) bool {
	md, err := m.Metadata()
	if err != nil {
		return false
	}
	d := DeadLetter{
		Projection: r.name, StreamID: stream, Subject: m.Subject(), Payload: string(m.Data()),
		Error: cause.Error(), Deliveries: md.NumDelivered, ParkedAt: time.Now().UTC(), StreamSeq: md.Sequence.Stream,
	}
	e, err := domain.UnmarshalEvent(m.Data())
	if err == nil {
		d.EventID, d.Version = e.ID, e.Version
	}
	d.ID = r.name + ":" + d.EventID
	if d.EventID == "" {
		d.ID = fmt.Sprintf("%s:seq-%d", r.name, md.Sequence.Stream)
	}
	if err := r.dead.Park(ctx, d); err != nil {
		r.log.Warn("dead letter not parked; redelivering", "err", err, "stream_id", stream)
		return false
	}
	r.metrics.deadLetters.WithLabelValues(r.name).Inc()
	r.setLastError(cause)
	r.log.Error("event parked in dead letters", "stream_id", stream, "event_id", d.EventID, "version", d.Version,
		"correlation_id", e.Metadata.CorrelationID, "err", cause)
	return true
}

// Retry re-applies a dead letter of this projection (see
// DeadLetterStore.Retry).
func (r *Runner) Retry(ctx context.Context, id string) error {
	if !strings.HasPrefix(id, r.name+":") {
		return fmt.Errorf("dead letter %s of projection %s: %w", id, r.name, domain.ErrNotFound)
	}
	return r.dead.Retry(ctx, id, func(ctx context.Context, evs []domain.Event) error {
		if r.seq != nil {
			return r.seq.Recount(ctx, id, evs)
		}
		_, failed, err := r.store.Apply(ctx, evs, true)
		for _, e := range failed {
			err = errors.Join(err, e)
		}
		return err
	})
}

// subjectStream is the last token of an event subject: the stream id.
func subjectStream(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// writeContext is the context of a batch's write: not abandoned at once
// when ctx is done (the process stops), so that a write already on its
// way is waited for rather than left to land unseen, but cut PinnedTTL/4
// after ctx is done, so that the stop does not hang on a store that does
// not answer. Call done once the write has returned.
func (r *Runner) writeContext(ctx context.Context) (wctx context.Context, done func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.PinnedTTL/4, cancel) })
	return wctx, func() {
		stop()
		cancel()
	}
}
