package projector

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/tracing"
)

// consumePartition runs partition tn's workers until its ownership ends
// (ctx done). When they fail (the consumer could not be looked up, was
// deleted, or its iterator closed) they are started again after a backoff
// within the ownership: one partition's trouble stays that partition's, and
// the other partitions' workers never stop for it.
func (r *Runner) consumePartition(ctx context.Context, tn *ownership) {
	var backoff time.Duration
	for ctx.Err() == nil {
		began := time.Now()
		err := r.consume(ctx, tn)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > r.cfg.LeaseTTL {
			backoff = 0 // it ran a while: a new failure, not the same one
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), r.cfg.LeaseTTL/4)
		if err == nil {
			err = errors.New("workers returned")
		}
		r.setLastError(err)
		r.log.Warn("projection partition consumer failed; restarting it", "partition", tn.p, "err", err, "retry_in", backoff)
		pause.For(ctx, backoff)
	}
}

// consume runs the workers of one partition until ctx is done, or until
// one of them fails.
func (r *Runner) consume(ctx context.Context, tn *ownership) error {
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

// pullExpiry is how long a pull request waits at the consumer's leader,
// and pullHeartbeat how often the leader tells an idle puller that it is
// there: a puller that misses two heartbeats pulls again, and so finds
// the consumer's new leader soon after a crash elected it; with the
// client's defaults, 30 s and 5 s, a partition stalled for the whole pull
// (docs/benchmarks.md, "Why a partition's puller hears from its
// consumer's leader every second").
const (
	pullExpiry    = 10 * time.Second
	pullHeartbeat = time.Second
)

// drainWait bounds how long a worker that stops waits for the messages
// its client holds before it gives back what its inbox has.
const drainWait = time.Second

// work pulls continuously into an inbox (see inbox); the first message of
// a batch is waited for, then a write slot (Writers), and the rest are
// whatever is waiting by then, so a batch costs no extra latency at low
// load and grows to BatchSize under load. When ctx is done, the messages
// pulled and not handled are given back (Nak), so the partition's next
// owner gets them at once rather than after AckWait.
func (r *Runner) work(ctx context.Context, cons jetstream.Consumer, tn *ownership) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(2*r.cfg.BatchSize), jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat))
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.ConsumerName(tn.p), err)
	}
	in := pullInto(it, r.cfg.AckWait/3, r.log.With("partition", tn.p))
	defer it.Stop()
	defer func() {
		// The messages the client holds are delivered into the inbox
		// and given back with the rest; a drain that does not end soon
		// (the connection is down) is cut short.
		it.Drain()
		select {
		case <-in.done:
		case <-time.After(drainWait):
		}
		for _, m := range in.rest() {
			_ = m.Nak()
		}
	}()
	for ctx.Err() == nil {
		first, err := in.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("consume %s: %w", r.ConsumerName(tn.p), err)
		}
		// A fenced partition holds its batch until a renewal gets
		// through, without taking a write slot from the others.
		wctx, err := tn.gate.wait(ctx)
		if err != nil {
			_ = first.Nak()
			return nil
		}
		select {
		case r.writers <- struct{}{}:
		case <-ctx.Done():
			_ = first.Nak()
			return nil
		}
		batch := in.take([]jetstream.Msg{first}, r.cfg.BatchSize, 500*time.Microsecond)
		r.handle(ctx, wctx, tn, batch)
		<-r.writers
	}
	return nil
}

// handle folds one batch of partition tn's messages and acknowledges,
// redelivers or parks each of them. ctx is the ownership's, wctx the write
// gate's (done when the partition's fence closes it).
func (r *Runner) handle(ctx, wctx context.Context, tn *ownership, msgs []jetstream.Msg) {
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
		_, span := tracer.Start(tracing.InCorrelationTrace(ctx, e.Metadata.CorrelationID), "projection.apply",
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
	actx, done := r.writeContext(wctx)
	out, failed, err := r.store.Apply(actx, events, fresh)
	done()
	tn.applied.Add(int64(out.Applied))
	r.metrics.partitionApplied(r.name, tn.p, out.Applied)
	if err != nil {
		// Nothing is known to be written: redeliver everything soon,
		// without counting it against the dead-letter limit.
		if wctx.Err() != nil {
			// The partition stops (its next owner gets them at once) or
			// its fence closed (they wait for a renewal here).
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
	var acks []jetstream.Msg
	defer func() { r.ack(ctx, acks) }()
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
				acks = append(acks, m.msg)
				continue
			}
			cause := errors.Join(poison[stream], applyErr)
			m.span.SetStatus(codes.Error, cause.Error())
			r.reject(ctx, m.msg, stream, cause)
		}
	}
}

// ackConfirmWait bounds the wait for the consumer's answer to a batch's
// last acknowledgement.
const ackConfirmWait = 2 * time.Second

// ack acknowledges msgs, all but the last without waiting, the last with
// a confirmation from the consumer's leader, which in a cluster answers
// once the acknowledgement is replicated, and so after the earlier ones of
// the batch, sent before it on the same connection to the same leader.
// While the consumer has no leader (a node lost, an election) the
// acknowledgements are lost: they are sent again, with backoff, until one
// is confirmed or the ownership ends, so that the messages do not stay
// pending until AckWait (30 s) and hold MaxAckPending meanwhile, which
// stalls the partition. The confirmation and its resends run beside the
// worker, which goes on with its next batch.
func (r *Runner) ack(ctx context.Context, msgs []jetstream.Msg) {
	if len(msgs) == 0 {
		return
	}
	last := msgs[len(msgs)-1]
	for _, m := range msgs[:len(msgs)-1] {
		_ = m.Ack()
	}
	go func() {
		cctx, cancel := context.WithTimeout(ctx, ackConfirmWait)
		err := last.DoubleAck(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		nc := r.js.Conn()
		b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond), backoff.WithMaxInterval(2*time.Second),
			backoff.WithMaxElapsedTime(r.cfg.AckWait))
		resend := func() error {
			for _, m := range msgs[:len(msgs)-1] {
				_ = nc.Publish(m.Reply(), ackBody)
			}
			cctx, cancel := context.WithTimeout(ctx, ackConfirmWait)
			defer cancel()
			_, err := nc.RequestWithContext(cctx, last.Reply(), ackBody)
			return err
		}
		if err := backoff.Retry(resend, backoff.WithContext(b, ctx)); err != nil && ctx.Err() == nil {
			r.log.Warn("projection acknowledgements not confirmed; AckWait redelivers them", "messages", len(msgs), "err", err)
		}
	}()
}

// ackBody is JetStream's acknowledgement.
var ackBody = []byte("+ACK")

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

// Retry re-applies a dead letter of this projection (see
// DeadLetterStore.Retry).
func (r *Runner) Retry(ctx context.Context, id string) error {
	if !strings.HasPrefix(id, r.name+":") {
		return fmt.Errorf("dead letter %s of projection %s: %w", id, r.name, domain.ErrNotFound)
	}
	return r.dead.Retry(ctx, id, func(ctx context.Context, evs []domain.Event) error {
		_, failed, err := r.store.Apply(ctx, evs, true)
		for _, e := range failed {
			err = errors.Join(err, e)
		}
		return err
	})
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

// writeContext is the context of a batch's write: not abandoned when the
// partition stops (ctx done), so that stop waits for a write already on
// its way instead of leaving it to land unseen and uncounted after stop
// returns, but cut LeaseTTL/4 after ctx is done, so that a write started
// before the fence still ends before a successor can claim the lease.
// Call done once the write has returned.
func (r *Runner) writeContext(ctx context.Context) (wctx context.Context, done func()) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.LeaseTTL/4, cancel) })
	return wctx, func() {
		stop()
		cancel()
	}
}
