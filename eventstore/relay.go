package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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
	// Partitions, when above 0, makes the stream store each event under
	// <prefix>.<partition>.<stream id>, the partition a hash of the stream
	// id modulo Partitions (JetStream's deterministic subject-token
	// partitioning, partition(n,1)), so consumers can each take one
	// partition and keep a stream's events in order.
	Partitions int
}

// Subject returns the subject of a stream's events.
func (c StreamConfig) Subject(streamID string) string { return c.SubjectPrefix + "." + streamID }

// EnsureStream creates the JetStream stream or updates its configuration:
// file storage, one subject per order stream, server-side de-duplication,
// and with Partitions the subject transform <prefix>.* ->
// <prefix>.{{partition(n,1)}}.{{wildcard(1)}}. A transform applies to the
// messages stored after it is set: those stored before keep their subject.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	sc := jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{c.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   max(c.Replicas, 1),
		Duplicates: c.Duplicates,
		MaxAge:     c.MaxAge,
	}
	if c.Partitions > 0 {
		sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: c.SubjectPrefix + ".*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", c.SubjectPrefix, c.Partitions)}
	}
	// A stream already as wanted is left alone: every process ensures the
	// stream at start, and nats-server 2.15.2 updating a stream's
	// configuration races with creating a consumer of it (the race
	// detector reported fileStore.UpdateConfig against ConsumerStore when
	// projector processes started side by side).
	if st, err := js.Stream(ctx, c.Name); err == nil && sameStream(st.CachedInfo().Config, sc) {
		return nil
	}
	_, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	return nil
}

// sameStream reports whether have already holds every setting of want
// that EnsureStream sets.
func sameStream(have, want jetstream.StreamConfig) bool {
	sameTransform := (have.SubjectTransform == nil) == (want.SubjectTransform == nil) &&
		(want.SubjectTransform == nil || *have.SubjectTransform == *want.SubjectTransform)
	return slices.Equal(have.Subjects, want.Subjects) && have.Storage == want.Storage && have.Retention == want.Retention &&
		have.Replicas == want.Replicas && have.Duplicates == want.Duplicates && have.MaxAge == want.MaxAge && sameTransform
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
	// AckTimeout bounds the sends and JetStream acks of one publish
	// round, and again the writing of one chunk of published markers
	// [10s]. A Sweeper's round takes at most LeaseTTL/4 for each besides,
	// so its lease renewals stay on time.
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
// is stored once. Once JetStream has acknowledged every event of a commit
// the commit is queued for its published marker, which a second loop
// writes; publishing never waits for markers. A crash between publish and
// marker republishes the commit later (see Sweeper); the stream's
// de-duplication window drops the copies it still remembers and the
// projections' version guard skips the rest.
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
	marks *markQueue
}

// NewRelay returns a Relay publishing to js the commits handed to its
// Appended, and marking them in db's event log.
func NewRelay(db *mongo.Database, js jetstream.JetStream, cfg RelayConfig, log *slog.Logger, m *Metrics) *Relay {
	cfg.setDefaults()
	return &Relay{
		out:   newOutbox(db, js, cfg.Stream, log, m),
		cfg:   cfg,
		queue: make(chan commitDoc, cfg.QueueSize),
		marks: newMarkQueue(cfg.QueueSize),
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

// Run publishes queued commits, a batch per round, and writes the
// published markers of the acknowledged ones, until ctx is done. It always
// returns nil: a failed round is logged and its commits are left to the
// sweep, since retrying here would hold up every later append. On
// cancellation the commits still queued get one last round and the
// markers still queued are written, each cut short after shutdownGrace;
// what is not finished is left to the sweep.
func (r *Relay) Run(ctx context.Context) error {
	published := make(chan struct{})
	marked := make(chan struct{})
	go func() {
		defer close(marked)
		r.markLoop(ctx, published)
	}()
	r.publishLoop(ctx)
	close(published)
	<-marked
	return nil
}

// publishLoop publishes a batch per round until ctx is done, then gives
// the commits still queued one last round. The commits of a failed round
// are tried again first, after a backoff, so an outage of NATS delays
// them rather than leaving them to the sweep; a commit that fails
// maxAttempts rounds while NATS is connected (it cannot be published, or
// JetStream refuses it), or that finds no room, is left to the sweep.
func (r *Relay) publishLoop(ctx context.Context) {
	var (
		retry    []commitDoc
		attempts = map[string]int{}
		backoff  time.Duration
	)
	for {
		batch := slices.Clone(retry[:min(len(retry), r.cfg.BatchSize)])
		retry = retry[len(batch):]
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
			case d := <-r.queue:
				batch = append(batch, d)
			}
		}
		batch = r.fill(batch)
		if len(batch) > 0 {
			acked, err := r.out.send(ctx, batch, r.cfg.AckTimeout)
			if dropped := r.marks.add(acked); dropped > 0 {
				r.out.log.Warn("published markers not queued; the sweep republishes their commits", "commits", dropped)
			}
			if err != nil {
				var left int
				retry, left = r.requeue(retry, batch, acked, attempts)
				r.out.log.Warn("own appends not published; trying again", "commits", len(batch)-len(acked), "left_to_sweep", left, "err", err)
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			} else {
				backoff = 0
			}
			for _, id := range acked {
				delete(attempts, id)
			}
		}
		if ctx.Err() != nil {
			return
		}
		if backoff > 0 && len(retry) > 0 {
			sleep(ctx, backoff)
		}
	}
}

// maxAttempts is how many rounds with NATS connected may fail to publish
// a commit before the Relay leaves it to the sweep.
const maxAttempts = 5

// requeue appends to retry the commits of batch that were not
// acknowledged, up to QueueSize of them, counting an attempt for each
// while NATS is connected. It returns the new retry list and how many
// commits it left to the sweep instead.
func (r *Relay) requeue(retry, batch []commitDoc, acked []string, attempts map[string]int) ([]commitDoc, int) {
	done := make(map[string]bool, len(acked))
	for _, id := range acked {
		done[id] = true
	}
	connected := r.out.connected()
	left := 0
	for _, d := range batch {
		if done[d.ID] {
			continue
		}
		if connected {
			attempts[d.ID]++
		}
		if attempts[d.ID] >= maxAttempts || len(retry) >= r.cfg.QueueSize {
			delete(attempts, d.ID)
			left++
			continue
		}
		retry = append(retry, d)
	}
	return retry, left
}

// markLoop writes queued published markers, a chunk per call, until ctx is
// done and published is closed; it then writes what is still queued,
// within shutdownGrace.
func (r *Relay) markLoop(ctx context.Context, published <-chan struct{}) {
	for {
		ids := r.marks.take(markChunk)
		if len(ids) == 0 {
			select {
			case <-r.marks.ready:
				continue
			case <-published:
				if r.marks.len() > 0 {
					continue
				}
				return
			}
		}
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
		if ctx.Err() != nil {
			cancel()
			mctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		}
		n, err := r.out.mark(mctx, ids)
		cancel()
		if err != nil {
			// The commits not marked are in the stream already: the
			// sweep republishes them, and de-duplication drops the copies.
			r.out.log.Warn("published markers not written; the sweep republishes their commits", "commits", len(ids)-n, "err", err)
			if ctx.Err() != nil {
				r.marks.take(r.marks.len()) // the store is gone; leave the rest to the sweep
			}
		}
	}
}

// markQueue holds the ids of commits published and acknowledged but not
// yet marked, at most limit of them.
type markQueue struct {
	mu    sync.Mutex
	ids   []string
	limit int
	ready chan struct{}
}

func newMarkQueue(limit int) *markQueue {
	return &markQueue{limit: limit, ready: make(chan struct{}, 1)}
}

// add queues ids and returns how many of them did not fit.
func (q *markQueue) add(ids []string) (dropped int) {
	if len(ids) == 0 {
		return 0
	}
	q.mu.Lock()
	room := max(q.limit-len(q.ids), 0)
	if len(ids) > room {
		dropped, ids = len(ids)-room, ids[:room]
	}
	q.ids = append(q.ids, ids...)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return dropped
}

// take removes and returns up to n queued ids, oldest first.
func (q *markQueue) take(n int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.ids))
	out := slices.Clone(q.ids[:n])
	q.ids = q.ids[n:]
	return out
}

func (q *markQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ids)
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

// send publishes the events of docs as async publishes (the JetStream
// context's WithPublishAsyncMaxPending bounds how many await their acks;
// a full window makes the send wait) and waits for the acks, all within
// ackTimeout. It returns the ids of the commits whose every event was
// acknowledged, also alongside an error (a publish or an ack failed); the
// others stay in the outbox for the sweep. A commit that cannot be decoded
// is logged, counted as a publish error and left in the outbox, where the
// backlog metrics show it. A canceled ctx still sends (the final round of
// a shutdown) but waits at most shutdownGrace for acks.
func (o *outbox) send(ctx context.Context, docs []commitDoc, ackTimeout time.Duration) ([]string, error) {
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
	if err := errors.Join(sendErr, ackErr); err != nil {
		o.metrics.publishError()
		return acked, fmt.Errorf("publish %d commits (%d acknowledged): %w", len(docs), len(acked), err)
	}
	return acked, nil
}

// publish sends docs (see send) and marks the acknowledged commits
// published, within ackTimeout for the acks and as long again for the
// markers (a shutdown that starts meanwhile lets the markers go on: the
// events are in the stream, and each marker lost costs a republish). It
// returns how many commits it marked, also alongside an error.
func (o *outbox) publish(ctx context.Context, docs []commitDoc, ackTimeout time.Duration) (int, error) {
	acked, err := o.send(ctx, docs, ackTimeout)
	if len(acked) == 0 {
		return 0, err
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	marked, merr := o.mark(mctx, acked)
	if merr != nil {
		err = errors.Join(err, fmt.Errorf("%d of %d acknowledged commits marked: %w", marked, len(acked), merr))
	}
	return marked, err
}

// connected reports whether the NATS connection can publish now.
func (o *outbox) connected() bool {
	nc := o.js.Conn()
	return nc != nil && nc.IsConnected()
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

// markChunk is the most published markers one bulk write carries. FerretDB
// 1.24 does not answer an update command of more than 64 statements (see
// package embedded); on MongoDB a chunk is one round trip.
const markChunk = 64

// mark sets the outbox marker of the commits ids with ordered bulk writes
// of markChunk updates by _id (the one filter the embedded store does not
// scan for), so a failure leaves a prefix marked and the rest for the
// sweep; it returns the length of that prefix. Not one update by $in:
// the embedded store scans the collection for it. Measured on the
// embedded store (500 markers on a 5,000-commit log): 2.5 s one updateOne
// at a time, 1.6 s in bulks of 50.
func (o *outbox) mark(ctx context.Context, ids []string) (int, error) {
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: domain.Timestamp(time.Now())}}}}
	for done := 0; done < len(ids); {
		chunk := ids[done:min(done+markChunk, len(ids))]
		models := make([]mongo.WriteModel, len(chunk))
		for i, id := range chunk {
			models[i] = mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}}).SetUpdate(set)
		}
		if _, err := o.commits.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true)); err != nil {
			var bwe mongo.BulkWriteException
			if errors.As(err, &bwe) && len(bwe.WriteErrors) > 0 {
				done += bwe.WriteErrors[0].Index
			}
			return done, fmt.Errorf("mark %d commits published: %w", len(ids)-done, mongoerr.Translate(err))
		}
		done += len(chunk)
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
