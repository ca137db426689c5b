package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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

// RelayConfig tunes the relay. Zero values take the defaults in brackets.
type RelayConfig struct {
	Stream       StreamConfig
	Owner        string        // instance id holding the lease
	BatchSize    int           // commits per round [256]
	PollInterval time.Duration // least time between two outbox sweeps [1s]
	LeaseTTL     time.Duration // lease lifetime; renewed every TTL/3 [10s]
	AckTimeout   time.Duration // wait for JetStream acks of one round [10s]
	MarkInterval time.Duration // pause of the marker loop when idle [1s]
}

// Relay is the outbox relay (invariant 3): it publishes one JetStream
// message per event of each unpublished commit, with Nats-Msg-Id set to the
// event id, waits for the acks, and only then marks the commits published.
// A crash between publish and mark republishes the commit; the stream's
// de-duplication window drops the copies it still remembers and the
// projections' version guard skips the rest. Only the holder of the "relay"
// lease publishes, so several instances may run a Relay.
//
// Commits appended in this process reach the relay directly (a hint with
// the committed document), so they are published without reading the log.
// A sweep of {published: false} catches everything else: commits of other
// processes, hints lost to a crash or dropped while not leader. On MongoDB
// the sweep is an index scan; on FerretDB 1.24 it decodes the whole
// collection, so sweeps are spaced at least ten times their own duration
// apart (and PollInterval).
type Relay struct {
	store   *Store
	js      jetstream.JetStream
	lease   *Lease
	cfg     RelayConfig
	log     *slog.Logger
	metrics *Metrics
	wake    chan struct{}

	mu    sync.Mutex
	hints []commitDoc

	// unmarked holds commits published and acknowledged but not yet marked
	// published in the log. Markers are written by their own loop, at most
	// half of the time, because on FerretDB each costs two scans of the
	// collection; publishing never waits for them, and sweeps skip these
	// commits. A crash before the marker is written republishes them, which
	// the de-duplication window and the projections' version guard absorb.
	markMu   sync.Mutex
	unmarked map[string]bool
	marked   chan struct{}
}

// maxHints bounds the hints kept while the relay is busy; the sweep finds
// any that are dropped.
const maxHints = 10_000

// NewRelay returns a relay publishing store's commits through js.
func NewRelay(store *Store, js jetstream.JetStream, cfg RelayConfig, log *slog.Logger, m *Metrics) *Relay {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	if cfg.MarkInterval <= 0 {
		cfg.MarkInterval = time.Second
	}
	r := &Relay{
		store: store, js: js, cfg: cfg, log: log, metrics: m,
		lease:    NewLease(store.commits.Database(), "relay", cfg.Owner, cfg.LeaseTTL),
		wake:     make(chan struct{}, 1),
		unmarked: map[string]bool{},
		marked:   make(chan struct{}, 1),
	}
	store.relay.Store(r)
	return r
}

// hint queues a commit just appended in this process and wakes the relay.
func (r *Relay) hint(d commitDoc) {
	r.mu.Lock()
	if len(r.hints) < maxHints {
		r.hints = append(r.hints, d)
	}
	r.mu.Unlock()
	r.Notify()
}

func (r *Relay) takeHints(n int) []commitDoc {
	r.mu.Lock()
	defer r.mu.Unlock()
	n = min(n, len(r.hints))
	out := slices.Clone(r.hints[:n])
	r.hints = slices.Delete(r.hints, 0, n)
	return out
}

// Notify wakes the relay so it publishes without waiting for its next poll.
// It never blocks.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx is done, then releases the lease. Errors of a
// round (store or broker down) are logged and retried with capped
// exponential backoff; Run returns nil on cancellation.
func (r *Relay) Run(ctx context.Context) error {
	markerDone := make(chan struct{})
	go func() {
		defer close(markerDone)
		r.markLoop(ctx)
	}()
	defer func() {
		<-markerDone
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := r.flushMarks(fctx); err != nil {
			r.log.Info("published markers left for the next start; those commits will be republished", "err", err)
		}
		cancel()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = r.lease.Release(rctx)
		cancel()
		r.setLeader(false)
	}()
	var (
		leader    bool
		renewedAt time.Time
		backoff   time.Duration
		sweptAt   time.Time
		sweepCost time.Duration
	)
	for ctx.Err() == nil {
		if !leader || time.Since(renewedAt) > r.cfg.LeaseTTL/3 {
			ok, err := r.lease.TryAcquire(ctx)
			if err != nil {
				r.log.Warn("relay lease claim failed", "err", err)
			}
			if ok != leader {
				r.log.Info("relay lease changed", "leader", ok, "owner", r.cfg.Owner)
			}
			leader = ok && err == nil
			r.setLeader(leader)
			renewedAt = time.Now()
		}
		more := false
		if leader {
			sweep := time.Since(sweptAt) >= max(r.cfg.PollInterval, 10*sweepCost)
			n, scan, err := r.round(ctx, sweep)
			if sweep && err == nil {
				sweptAt, sweepCost = time.Now(), scan
			}
			switch {
			case err != nil && ctx.Err() == nil:
				backoff = min(max(2*backoff, 50*time.Millisecond), 5*time.Second)
				r.log.Warn("relay round failed", "err", err, "retry_in", backoff)
				if r.metrics != nil {
					r.metrics.publishErrors.Inc()
				}
				sleep(ctx, backoff)
				continue
			case err == nil:
				backoff = 0
				more = n >= r.cfg.BatchSize
			}
		} else {
			r.takeHints(maxHints) // the leader's sweep publishes them
		}
		if more {
			continue
		}
		wait := r.cfg.PollInterval
		if !leader {
			wait = r.cfg.LeaseTTL / 3
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

func (r *Relay) setLeader(on bool) {
	if r.metrics == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	r.metrics.leader.Set(v)
}

// PublishPending runs one relay round with a sweep of the outbox: it
// publishes up to BatchSize unpublished commits and marks the fully
// acknowledged ones published. It returns how many commits it handled. A
// commit with an unacknowledged event stays unpublished and is retried.
func (r *Relay) PublishPending(ctx context.Context) (int, error) {
	n, _, err := r.round(ctx, true)
	return n, errors.Join(err, r.flushMarks(ctx))
}

// round publishes the queued hints and, when sweep is set, the oldest
// unpublished commits of the log. It returns how many commits it handled
// and how long the sweep's read took. Hints of a failed round are queued
// again.
func (r *Relay) round(ctx context.Context, sweep bool) (n int, scan time.Duration, err error) {
	docs := r.takeHints(r.cfg.BatchSize)
	defer func() {
		if err != nil {
			r.requeue(docs)
		}
	}()
	if sweep {
		// Commits published but not yet marked are still published:false;
		// the snapshot is taken before the read so that none marked in
		// between is taken for unpublished, and the limit leaves room for
		// all of them. A sweep costs a scan of the whole collection on
		// FerretDB however few it returns, so it takes up to sweepBatches
		// batches at once.
		r.markMu.Lock()
		unmarked := maps.Clone(r.unmarked)
		r.markMu.Unlock()
		start := time.Now()
		cur, err := r.store.commits.Find(ctx, bson.D{{Key: "published", Value: false}},
			options.Find().SetSort(bson.D{{Key: "recorded_at", Value: 1}}).SetLimit(int64(sweepBatches*r.cfg.BatchSize+len(unmarked))))
		if err != nil {
			return 0, 0, fmt.Errorf("read outbox: %w", mongoerr.Translate(err))
		}
		var swept []commitDoc
		if err := cur.All(ctx, &swept); err != nil {
			return 0, 0, fmt.Errorf("read outbox: %w", mongoerr.Translate(err))
		}
		scan = time.Since(start)
		seen := map[string]bool{}
		for _, d := range docs {
			seen[d.ID] = true
		}
		backlog, oldest := 0, time.Time{}
		for _, d := range swept {
			if unmarked[d.ID] {
				continue
			}
			if backlog++; oldest.IsZero() {
				oldest = d.RecordedAt
			}
			if !seen[d.ID] {
				docs = append(docs, d)
			}
		}
		r.setBacklog(backlog, oldest)
	}
	for chunk := range slices.Chunk(docs, r.cfg.BatchSize) {
		k, err := r.publish(ctx, chunk)
		if n += k; err != nil {
			return n, scan, err
		}
	}
	return n, scan, nil
}

// requeue puts hints back at the front of the queue; a commit among them
// that was published meanwhile is only published again, which the
// de-duplication window absorbs.
func (r *Relay) requeue(docs []commitDoc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.hints)+len(docs) <= maxHints {
		r.hints = append(slices.Clone(docs), r.hints...)
	}
}

// sweepBatches is how many batches one outbox sweep may return.
const sweepBatches = 16

// markLoop writes published markers until ctx is done, pausing after
// each bulk as long as the bulk took (so at most half of the time).
func (r *Relay) markLoop(ctx context.Context) {
	for ctx.Err() == nil {
		start := time.Now()
		n, err := r.markSome(ctx, markChunk)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("published markers not written; retrying", "err", err)
		}
		if n == 0 || err != nil {
			t := time.NewTimer(r.cfg.MarkInterval)
			select {
			case <-ctx.Done():
			case <-r.marked:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		sleep(ctx, time.Since(start))
	}
}

// markSome writes the markers of up to n unmarked commits.
func (r *Relay) markSome(ctx context.Context, n int) (int, error) {
	r.markMu.Lock()
	ids := make([]string, 0, n)
	for id := range r.unmarked {
		if len(ids) == n {
			break
		}
		ids = append(ids, id)
	}
	r.markMu.Unlock()
	if len(ids) == 0 {
		return 0, nil
	}
	if err := r.markPublished(ctx, ids); err != nil {
		return 0, err
	}
	r.markMu.Lock()
	for _, id := range ids {
		delete(r.unmarked, id)
	}
	r.markMu.Unlock()
	return len(ids), nil
}

// flushMarks writes every pending marker now.
func (r *Relay) flushMarks(ctx context.Context) error {
	for {
		n, err := r.markSome(ctx, markChunk)
		if n == 0 || err != nil {
			return err
		}
	}
}

// publish sends docs' events and queues the acknowledged commits for their
// published marker.
func (r *Relay) publish(ctx context.Context, docs []commitDoc) (int, error) {
	type pending struct {
		commit  int
		futures []jetstream.PubAckFuture
		span    trace.Span
	}
	rounds := make([]pending, 0, len(docs))
	defer func() {
		for _, p := range rounds {
			p.span.End() // a second End is ignored
		}
	}()
	var firstErr error
	for i, d := range docs {
		p := pending{commit: i}
		correlation := ""
		if len(d.Events) > 0 {
			correlation = d.Events[0].CorrelationID
		}
		_, p.span = tracer.Start(inCorrelationTrace(ctx, correlation), "relay.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("orderd.stream_id", d.StreamID), attribute.Int64("orderd.first_version", d.FirstVersion),
				attribute.Int("orderd.events", len(d.Events)), attribute.String("orderd.correlation_id", correlation)))
		events, err := d.events()
		if err != nil {
			p.span.SetStatus(codes.Error, err.Error())
			p.span.End()
			// A commit that cannot be decoded cannot be published; it stays
			// in the outbox, visible in the backlog metrics.
			firstErr = errors.Join(firstErr, err)
			continue
		}
		for _, e := range events {
			msg, err := eventMsg(r.cfg.Stream, e)
			if err != nil {
				firstErr = errors.Join(firstErr, err)
				p.futures = nil
				break
			}
			f, err := r.js.PublishMsgAsync(msg, jetstream.WithExpectStream(r.cfg.Stream.Name))
			if err != nil {
				p.span.SetStatus(codes.Error, err.Error())
				p.span.End()
				return 0, fmt.Errorf("publish %s v%d: %w", e.StreamID, e.Version, err)
			}
			p.futures = append(p.futures, f)
		}
		if len(p.futures) == len(d.Events) {
			rounds = append(rounds, p)
		} else {
			p.span.SetStatus(codes.Error, "not published")
			p.span.End()
		}
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	var acked []string
	events := 0
	for _, p := range rounds {
		ok := true
		for _, f := range p.futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				ok, firstErr = false, errors.Join(firstErr, err)
				p.span.SetStatus(codes.Error, err.Error())
			case <-timeout.C:
				return 0, fmt.Errorf("wait for JetStream acks: timed out after %s", r.cfg.AckTimeout)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		p.span.End()
		if ok {
			acked = append(acked, docs[p.commit].ID)
			events += len(p.futures)
		}
	}
	if len(acked) > 0 {
		r.markMu.Lock()
		for _, id := range acked {
			r.unmarked[id] = true
		}
		r.markMu.Unlock()
		select {
		case r.marked <- struct{}{}:
		default:
		}
		if r.metrics != nil {
			r.metrics.published.Add(float64(events))
		}
	}
	if firstErr != nil {
		return len(docs), fmt.Errorf("publish: %d of %d commits acknowledged: %w", len(acked), len(docs), firstErr)
	}
	return len(docs), nil
}

// markPublished sets the outbox marker of the commits ids, one updateOne
// by _id each. Not one update by $in: FerretDB runs that as a single
// SQLite transaction that scans the collection once per matched commit,
// holding the write lock long enough to time out every other writer; and
// its bulk updates are slower than the same updates one by one.
func (r *Relay) markPublished(ctx context.Context, ids []string) error {
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: domain.Timestamp(time.Now())}}}}
	for _, id := range ids {
		if _, err := r.store.commits.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, set); err != nil {
			return fmt.Errorf("mark %s published: %w", id, mongoerr.Translate(err))
		}
	}
	return nil
}

// markChunk is how many published markers the marker loop writes between
// pauses.
const markChunk = 32

// Backlog returns the number of unpublished commits and the age of the
// oldest one (0 when there is none).
func (r *Relay) Backlog(ctx context.Context) (int64, time.Duration, error) {
	filter := bson.D{{Key: "published", Value: false}}
	n, err := r.store.commits.CountDocuments(ctx, filter)
	if err != nil {
		return 0, 0, fmt.Errorf("count outbox: %w", mongoerr.Translate(err))
	}
	if n == 0 {
		return 0, 0, nil
	}
	var oldest commitDoc
	err = r.store.commits.FindOne(ctx, filter, options.FindOne().SetSort(bson.D{{Key: "recorded_at", Value: 1}}).
		SetProjection(bson.D{{Key: "recorded_at", Value: 1}})).Decode(&oldest)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read outbox head: %w", mongoerr.Translate(err))
	}
	return n, time.Since(oldest.RecordedAt), nil
}

// setBacklog records what a sweep saw: the unpublished commits (at most a
// batch: the gauge then reads "at least") and the oldest one's age.
func (r *Relay) setBacklog(n int, oldest time.Time) {
	if r.metrics == nil {
		return
	}
	r.metrics.unpublished.Set(float64(n))
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	r.metrics.oldestAgeSecond.Set(age)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
