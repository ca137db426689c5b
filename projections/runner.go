package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
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
	Stream        string        // JetStream stream name
	Subject       string        // filter subject, e.g. "orders.events.>"
	Workers       int           // pull loops in this process [2]
	BatchSize     int           // most messages folded per write round [256]
	MaxDeliveries int           // deliveries of a failing event before it is parked [5]
	AckWait       time.Duration // redelivery timeout of an unacknowledged message [30s]
	LagInterval   time.Duration // consumer lag sampling [2s]
	// Lease, when set, makes the projection exclusive: only the instance
	// holding it consumes, the others wait as hot standbys and take over
	// when it expires (a killed holder's unacknowledged deliveries come
	// back after AckWait). Renewed every LeaseTTL/3; a holder whose
	// renewals fail for LeaseTTL/2 stops writing, before the lease can
	// pass to another instance.
	Lease    Lease
	LeaseTTL time.Duration // [10s]
}

// Lease is a named claim held by one instance at a time
// (eventstore.Lease). TryAcquire claims or renews it.
type Lease interface {
	TryAcquire(ctx context.Context) (bool, error)
	Release(ctx context.Context) error
}

// applier is what a Runner needs of a Store, whatever its document type.
type applier interface {
	apply(ctx context.Context, events []domain.Event, fresh bool) (Outcome, map[string]error, error)
	EnsureIndexes(ctx context.Context) error
	purge()
}

// Runner feeds one projection from its durable JetStream pull consumer,
// "proj_<name>", shared by every worker of every process. Each worker takes
// the messages at hand (up to BatchSize), folds them with one read and one
// bulk write per round, and acknowledges a message only once its stream's
// document reflects it. Events that cannot be applied are redelivered with
// backoff and, after MaxDeliveries, parked in the dead-letter collection and
// terminated; failures that may pass (store down) are redelivered without
// limit.
type Runner struct {
	name    string
	store   applier
	js      jetstream.JetStream
	dead    *DeadLetters
	cfg     RunnerConfig
	log     *slog.Logger
	metrics *Metrics
	lastErr atomic.Pointer[string]
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

// NewRunner returns a Runner feeding the projection p.
func NewRunner[D any](p *Projection[D], js jetstream.JetStream, dead *DeadLetters, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.MaxDeliveries <= 0 {
		cfg.MaxDeliveries = 5
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.LagInterval <= 0 {
		cfg.LagInterval = 2 * time.Second
	}
	return &Runner{name: p.def.Name, store: p, js: js, dead: dead, cfg: cfg, log: log.With("projection", p.def.Name), metrics: m}
}

// Name is the projection's name.
func (r *Runner) Name() string { return r.name }

// ConsumerName is the durable consumer's name.
func (r *Runner) ConsumerName() string { return "proj_" + r.name }

// Consumer creates or updates the durable consumer and returns it.
func (r *Runner) Consumer(ctx context.Context) (jetstream.Consumer, error) {
	c, err := r.js.CreateOrUpdateConsumer(ctx, r.cfg.Stream, jetstream.ConsumerConfig{
		Durable:       r.ConsumerName(),
		FilterSubject: r.cfg.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    -1,
		MaxAckPending: 4 * r.cfg.Workers * r.cfg.BatchSize,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", r.ConsumerName(), err)
	}
	return c, nil
}

// Run ensures the indexes and the consumer, then runs the workers until ctx
// is done; with a Lease, only while this instance holds it. It returns nil
// on cancellation.
func (r *Runner) Run(ctx context.Context) error {
	if r.cfg.Lease == nil {
		return r.consume(ctx)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = r.cfg.Lease.Release(rctx)
		cancel()
	}()
	for ctx.Err() == nil {
		if err := r.busReachable(ctx); err != nil {
			// A holder that cannot pull would keep the lease and apply
			// nothing: leave the lease to an instance that can.
			if ctx.Err() == nil {
				r.log.Warn("projection lease not claimed: the bus is unreachable", "err", err)
			}
			sleep(ctx, r.cfg.LeaseTTL/3)
			continue
		}
		ok, err := r.cfg.Lease.TryAcquire(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("projection lease claim failed", "err", err)
		}
		if !ok || err != nil {
			sleep(ctx, r.cfg.LeaseTTL/3)
			continue
		}
		r.log.Info("projection lease acquired: consuming")
		// Another holder may have written since this process last did.
		r.store.purge()
		if err := r.whileHeld(ctx); err != nil {
			return err
		}
	}
	return nil
}

// whileHeld consumes while the lease is renewed. It returns nil when the
// lease is lost (the workers are stopped first) or ctx is done, and the
// workers' error otherwise.
func (r *Runner) whileHeld(ctx context.Context) error {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.consume(hctx) }()
	renewed, busOK := time.Now(), time.Now()
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
		}
		if err := r.busReachable(ctx); err == nil {
			busOK = time.Now()
		} else if time.Since(busOK) > r.cfg.LeaseTTL/2 {
			// Renewing on a timer whatever the pulls do would hold the
			// projection still for as long as this instance lives.
			r.log.Warn("projection lease released: the bus is unreachable", "err", err)
			cancel()
			<-done
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := r.cfg.Lease.Release(rctx); err != nil {
				r.log.Warn("projection lease release failed; it expires instead", "err", err)
			}
			rcancel()
			return nil
		}
		ok, err := r.cfg.Lease.TryAcquire(ctx)
		if ok && err == nil {
			renewed = time.Now()
			continue
		}
		if err == nil || time.Since(renewed) > r.cfg.LeaseTTL/2 {
			r.log.Warn("projection lease lost: stopping the workers", "err", err, "taken_by_another", err == nil)
			cancel()
			<-done
			return nil
		}
		if ctx.Err() == nil {
			r.log.Warn("projection lease renewal failed", "err", err)
		}
	}
}

// busReachable makes one JetStream API round trip, bounded by a sixth of
// the lease.
func (r *Runner) busReachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/6)
	defer cancel()
	if _, err := r.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream account info: %w", err)
	}
	return nil
}

// consume ensures the indexes and the consumer, then runs the workers until
// ctx is done.
func (r *Runner) consume(ctx context.Context) error {
	if err := r.store.EnsureIndexes(ctx); err != nil {
		return err
	}
	cons, err := r.Consumer(ctx)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for i := 0; i < r.cfg.Workers; i++ {
		g.Go(func() error { return r.work(ctx, cons) })
	}
	g.Go(func() error { r.sampleLag(ctx, cons); return nil })
	return g.Wait()
}

// work pulls continuously; the first message of a batch is waited for, the
// rest are whatever is already buffered, so a batch costs no extra latency
// at low load and grows to BatchSize under load.
func (r *Runner) work(ctx context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * r.cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("consume %s: %w", r.ConsumerName(), err)
	}
	defer it.Stop()
	for ctx.Err() == nil {
		first, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return fmt.Errorf("consume %s: %w", r.ConsumerName(), err)
			}
			r.log.Warn("projection pull failed", "err", err)
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		batch := []jetstream.Msg{first}
		for len(batch) < r.cfg.BatchSize {
			m, err := it.Next(jetstream.NextMaxWait(500 * time.Microsecond))
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
		r.Handle(ctx, batch)
	}
	return nil
}

// Handle folds one batch of messages and acknowledges, redelivers or parks
// each of them.
func (r *Runner) Handle(ctx context.Context, msgs []jetstream.Msg) {
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
	_, failed, err := r.store.apply(ctx, events, fresh)
	if err != nil {
		// Nothing is known to be written: redeliver everything soon,
		// without counting it against the dead-letter limit.
		if ctx.Err() != nil {
			return // shutting down: the messages are redelivered after AckWait
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

// Lag returns the number of messages the consumer has not acknowledged.
func (r *Runner) Lag(ctx context.Context) (uint64, error) {
	c, err := r.js.Consumer(ctx, r.cfg.Stream, r.ConsumerName())
	if err != nil {
		return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(), err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("consumer %s: %w", r.ConsumerName(), err)
	}
	return info.NumPending + uint64(info.NumAckPending), nil
}

// sampleLag creates the projection's counters, then samples the consumer
// lag and the number of dead letters parked, at once and every
// LagInterval, until ctx is done.
func (r *Runner) sampleLag(ctx context.Context, cons jetstream.Consumer) {
	r.metrics.initProjection(r.name)
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	for {
		if info, err := cons.Info(ctx); err == nil {
			r.metrics.setLag(r.name, float64(info.NumPending)+float64(info.NumAckPending))
		}
		// The dead letters parked now: one count of a small collection.
		if r.metrics != nil && r.dead != nil {
			if n, err := r.dead.Count(ctx, r.name); err == nil {
				r.metrics.setDeadLetters(r.name, float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
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
