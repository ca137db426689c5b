package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// StreamConfig names the JetStream stream the relay publishes to. Each
// event goes to subject SubjectPrefix + "." + stream id.
type StreamConfig struct {
	Name          string        // JetStream stream name, e.g. "ORDERS"
	SubjectPrefix string        // e.g. "orders.events"
	Replicas      int           // 1 for a single server, 3 for a cluster
	Duplicates    time.Duration // de-duplication window for Nats-Msg-Id
	MaxAge        time.Duration // how long messages are kept; 0 keeps them
}

// Subject returns the subject of a stream's events.
func (c StreamConfig) Subject(streamID string) string { return c.SubjectPrefix + "." + streamID }

// EnsureStream creates the JetStream stream or updates its configuration:
// file storage, one subject per order stream, server-side de-duplication.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{c.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   max(c.Replicas, 1),
		Duplicates: c.Duplicates,
		MaxAge:     c.MaxAge,
	})
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	return nil
}

// RelayConfig tunes the outbox relay: the Relay that publishes a
// process's own appends and the Sweeper that publishes what a crashed
// process left behind. Zero values take the defaults in brackets.
type RelayConfig struct {
	Stream StreamConfig
	// Owner is this instance's id, the owner of the sweep lease.
	Owner string
	// BatchSize is the most commits one publish round takes [256].
	BatchSize int
	// QueueSize is how many appended commits may wait for the Relay's
	// publisher; an append that finds the queue full is left to the
	// sweep [4096].
	QueueSize int
	// AckTimeout bounds one publish round: its sends, their JetStream
	// acks and the published markers [10s]. A Sweeper's round takes at
	// most LeaseTTL/2 besides, so its lease renewals stay on time.
	AckTimeout time.Duration
	// SweepInterval is the pause between two sweeps of the outbox when
	// the last one found less than a batch [5s].
	SweepInterval time.Duration
	// SweepGrace is the age, by recorded_at, at which an unpublished
	// commit counts as left behind and the sweep publishes it [5s]. It
	// keeps the sweep from racing the appending instance's own publish;
	// instance clocks must agree to well within it.
	SweepGrace time.Duration
	// LeaseTTL is the sweep lease's lifetime, renewed every TTL/3 [10s].
	LeaseTTL time.Duration
}

func (c *RelayConfig) setDefaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 4096
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 5 * time.Second
	}
	if c.SweepGrace <= 0 {
		c.SweepGrace = 5 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
}

// Relay publishes the commits its own process appends (invariant 3), at
// once and without a lease: one JetStream message per event, with
// Nats-Msg-Id set to the event id, so a commit that two instances publish
// is stored once. It waits for the acks and then marks the commits
// published. A crash between publish and mark republishes the commit
// later (see Sweeper); the stream's de-duplication window drops the copies
// it still remembers and the projections' version guard skips the rest.
//
// The Store tells the Relay of each append through its append hook
// (WithAppendHook(relay.Appended)), which only queues the commit: a
// command never waits for NATS. A commit the Relay does not publish (its
// queue was full, the round failed, the process stopped) stays
// published:false in the log, and a Sweeper publishes it.
type Relay struct {
	out   outbox
	cfg   RelayConfig
	queue chan commitDoc
}

// NewRelay returns a Relay publishing to js the commits handed to its
// Appended, and marking them in db's event log.
func NewRelay(db *mongo.Database, js jetstream.JetStream, cfg RelayConfig, log *slog.Logger, m *Metrics) *Relay {
	cfg.setDefaults()
	return &Relay{
		out:   newOutbox(db, js, cfg.Stream, log, m),
		cfg:   cfg,
		queue: make(chan commitDoc, cfg.QueueSize),
	}
}

// Appended is the Store's append hook: it queues c for publishing and
// never blocks. When the queue is full (the publisher is behind, NATS is
// slow or down, or Run is not running) c is left to the sweep.
func (r *Relay) Appended(c Committed) {
	select {
	case r.queue <- c.doc:
	default:
	}
}

// Run publishes queued commits, a batch per round, until ctx is done. It
// always returns nil: a failed round is logged and its commits are left
// to the sweep, since retrying here would hold up every later append. On
// cancellation the commits still queued get one last round, cut short
// after shutdownGrace; what it does not finish is left to the sweep.
func (r *Relay) Run(ctx context.Context) error {
	batch := make([]commitDoc, 0, r.cfg.BatchSize)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
		case d := <-r.queue:
			batch = append(batch, d)
		}
		batch = r.fill(batch)
		if len(batch) > 0 {
			if _, err := r.out.publish(ctx, batch, r.cfg.AckTimeout); err != nil {
				r.out.log.Warn("own appends not published; left to the outbox sweep", "commits", len(batch), "err", err)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// fill adds queued commits to batch, without waiting, up to a batch.
func (r *Relay) fill(batch []commitDoc) []commitDoc {
	for len(batch) < r.cfg.BatchSize {
		select {
		case d := <-r.queue:
			batch = append(batch, d)
		default:
			return batch
		}
	}
	return batch
}

// shutdownGrace bounds what a shutdown waits for: the acks of a round
// under way (from the cancellation on; its markers keep the round's own
// deadline), and the last round of queued commits. Long enough for acks already on the wire,
// short enough not to hold up a shutdown when NATS is down.
const shutdownGrace = 2 * time.Second

// outbox publishes commits and writes their published markers: the one
// publish path of the Relay and the Sweeper.
type outbox struct {
	commits *mongo.Collection
	js      jetstream.JetStream
	stream  StreamConfig
	log     *slog.Logger
	metrics *Metrics
}

func newOutbox(db *mongo.Database, js jetstream.JetStream, stream StreamConfig, log *slog.Logger, m *Metrics) outbox {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return outbox{commits: db.Collection(CommitsCollection), js: js, stream: stream, log: log, metrics: m}
}

// publish sends the events of docs as async publishes (the JetStream
// context's WithPublishAsyncMaxPending bounds how many await their acks;
// a full window makes the send wait), waits for the acks, and marks the
// fully acknowledged commits published, all within ackTimeout. It returns
// how many commits it marked, also alongside an error (a publish, an ack
// or a marker failed): the commits not marked stay in the outbox for the
// sweep. A commit that cannot be decoded is logged, counted as a publish
// error and left in the outbox, where the backlog metrics show it. A
// canceled ctx still sends (the final round of a shutdown) but waits at
// most shutdownGrace for acks.
func (o *outbox) publish(ctx context.Context, docs []commitDoc, ackTimeout time.Duration) (int, error) {
	type sent struct {
		doc     commitDoc
		futures []jetstream.PubAckFuture
		span    trace.Span
	}
	if ctx.Err() != nil {
		ackTimeout = min(ackTimeout, shutdownGrace)
	}
	deadline := time.Now().Add(ackTimeout)
	var (
		out     []sent
		sendErr error
	)
	for _, d := range docs {
		if sendErr != nil {
			break
		}
		correlation := ""
		if len(d.Events) > 0 {
			correlation = d.Events[0].CorrelationID
		}
		_, span := tracer.Start(inCorrelationTrace(ctx, correlation), "relay.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("orderd.stream_id", d.StreamID), attribute.Int64("orderd.first_version", d.FirstVersion),
				attribute.Int("orderd.events", len(d.Events)), attribute.String("orderd.correlation_id", correlation)))
		events, err := d.events()
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			o.log.Error("commit cannot be decoded; it stays in the outbox", "commit", d.ID, "err", err)
			o.metrics.publishError()
			continue
		}
		s := sent{doc: d, span: span}
		for _, e := range events {
			f, err := publishAsync(o.js, o.stream, e, time.Until(deadline))
			if err != nil {
				sendErr = err
				break
			}
			s.futures = append(s.futures, f)
		}
		if sendErr != nil {
			span.SetStatus(codes.Error, sendErr.Error())
			span.End()
			break
		}
		out = append(out, s)
	}

	// Wait for the acks of what was sent, commit by commit: a commit is
	// marked only when every one of its events is acknowledged.
	w := newAckWait(ctx, time.Until(deadline))
	defer w.stop()
	var (
		acked  []string
		events int
		ackErr error // the first; the others are usually the same
	)
	for _, s := range out {
		var err error
		for _, f := range s.futures {
			if err = w.wait(f); err != nil {
				break
			}
		}
		if err != nil {
			if ackErr == nil {
				ackErr = err
			}
			s.span.SetStatus(codes.Error, err.Error())
		} else {
			acked = append(acked, s.doc.ID)
			events += len(s.futures)
		}
		s.span.End()
	}
	o.metrics.publishedEvents(events)
	err := errors.Join(sendErr, ackErr)
	marked := 0
	if len(acked) > 0 {
		// The events are in the stream, and each marker lost costs a
		// republish: a shutdown that starts meanwhile lets the markers
		// go on, until the round's deadline.
		mctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		var merr error
		marked, merr = o.mark(mctx, acked)
		err = errors.Join(err, merr)
		cancel()
	}
	if err != nil {
		o.metrics.publishError()
		return marked, fmt.Errorf("publish %d commits (%d acknowledged, %d marked): %w", len(docs), len(acked), marked, err)
	}
	return marked, nil
}

// ackWait waits for acks until one deadline for all of them, or until
// shutdownGrace after ctx is done; after either it gives up at once.
type ackWait struct {
	ctx      context.Context
	timeout  *time.Timer
	within   time.Duration
	done     <-chan struct{}
	grace    <-chan time.Time
	gaveUpOn error
}

func newAckWait(ctx context.Context, within time.Duration) *ackWait {
	return &ackWait{ctx: ctx, timeout: time.NewTimer(within), within: within.Round(time.Millisecond), done: ctx.Done()}
}

func (w *ackWait) stop() { w.timeout.Stop() }

// wait returns nil when f is acknowledged, or the error that refused it
// or ended the wait.
func (w *ackWait) wait(f jetstream.PubAckFuture) error {
	if w.gaveUpOn != nil {
		return w.gaveUpOn
	}
	// An ack already in counts even when the deadline has passed too.
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	default:
	}
	for {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-w.timeout.C:
			w.gaveUpOn = fmt.Errorf("wait for JetStream acks: none within %s", w.within)
			return w.gaveUpOn
		case <-w.grace:
			w.gaveUpOn = fmt.Errorf("wait for JetStream acks: %w", w.ctx.Err())
			return w.gaveUpOn
		case <-w.done:
			w.done, w.grace = nil, time.After(shutdownGrace)
		}
	}
}

// mark sets the outbox marker of the commits ids, one updateOne by _id
// each (the one filter the embedded store does not scan for), in order, so
// a failure leaves a prefix marked and the rest for the sweep; it returns
// the length of that prefix. Not one
// bulk write: FerretDB 1.24 did not finish an ordered bulk of 100 updates
// by _id on a 1,000-commit collection within 20s, where 64 single updates
// took 0.1s; and a long write holds up every other writer of the embedded
// store. On MongoDB each is an index look-up.
func (o *outbox) mark(ctx context.Context, ids []string) (int, error) {
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: domain.Timestamp(time.Now())}}}}
	for i, id := range ids {
		if _, err := o.commits.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, set); err != nil {
			return i, fmt.Errorf("mark %s published: %w", id, mongoerr.Translate(err))
		}
	}
	return len(ids), nil
}

// publishAsync sends e on its subject with Nats-Msg-Id = event id and
// returns the ack's future. When the JetStream context already awaits
// its maximum of acks it waits up to stall for room.
func publishAsync(js jetstream.JetStream, cfg StreamConfig, e domain.Event, stall time.Duration) (jetstream.PubAckFuture, error) {
	msg, err := eventMsg(cfg, e)
	if err != nil {
		return nil, fmt.Errorf("publish %s v%d: %w", e.StreamID, e.Version, err)
	}
	if stall <= 0 {
		return nil, fmt.Errorf("publish %s v%d: the round's deadline has passed", e.StreamID, e.Version)
	}
	f, err := js.PublishMsgAsync(msg, jetstream.WithExpectStream(cfg.Name), jetstream.WithStallWait(stall))
	if err != nil {
		return nil, fmt.Errorf("publish %s v%d: %w", e.StreamID, e.Version, err)
	}
	return f, nil
}
