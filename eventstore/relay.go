package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
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
	PollInterval time.Duration // safety-net poll when not woken [500ms]
	LeaseTTL     time.Duration // lease lifetime; renewed every TTL/3 [10s]
	AckTimeout   time.Duration // wait for JetStream acks of one round [10s]
}

// Relay is the outbox relay (invariant 3): it reads unpublished commits in
// _id order, publishes one JetStream message per event with Nats-Msg-Id set
// to the event id, waits for the acks, and only then marks the commits
// published. A crash between publish and mark republishes the commit; the
// stream's de-duplication window drops the copies it still remembers and
// the projections' version guard skips the rest. Only the holder of the
// "relay" lease publishes, so several instances may run a Relay.
type Relay struct {
	store   *Store
	js      jetstream.JetStream
	lease   *Lease
	cfg     RelayConfig
	log     *slog.Logger
	metrics *Metrics
	wake    chan struct{}
}

// NewRelay returns a relay publishing store's commits through js.
func NewRelay(store *Store, js jetstream.JetStream, cfg RelayConfig, log *slog.Logger, m *Metrics) *Relay {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 256
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	return &Relay{
		store: store, js: js, cfg: cfg, log: log, metrics: m,
		lease: NewLease(store.commits.Database(), "relay", cfg.Owner, cfg.LeaseTTL),
		wake:  make(chan struct{}, 1),
	}
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
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = r.lease.Release(ctx)
		r.setLeader(false)
	}()
	var (
		leader    bool
		renewedAt time.Time
		backoff   time.Duration
		statsAt   time.Time
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
		full := false
		if leader {
			n, err := r.PublishPending(ctx)
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
				full = n == r.cfg.BatchSize
			}
			if time.Since(statsAt) > 5*time.Second {
				r.updateStats(ctx)
				statsAt = time.Now()
			}
		}
		if full {
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

// PublishPending runs one relay round: it publishes up to BatchSize
// unpublished commits and marks the fully acknowledged ones published. It
// returns how many commits it read. A commit with an unacknowledged event
// stays unpublished and is retried next round.
func (r *Relay) PublishPending(ctx context.Context) (int, error) {
	cur, err := r.store.commits.Find(ctx, bson.D{{Key: "published", Value: false}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(r.cfg.BatchSize)))
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", translate(err))
	}
	var docs []commitDoc
	if err := cur.All(ctx, &docs); err != nil {
		return 0, fmt.Errorf("read outbox: %w", translate(err))
	}
	if len(docs) == 0 {
		return 0, nil
	}
	type pending struct {
		commit  int
		futures []jetstream.PubAckFuture
	}
	rounds := make([]pending, 0, len(docs))
	var firstErr error
	for i, d := range docs {
		p := pending{commit: i}
		events, err := d.events()
		if err != nil {
			// A commit that cannot be decoded cannot be published; it stays
			// in the outbox, visible in the backlog metrics.
			firstErr = errors.Join(firstErr, err)
			continue
		}
		for _, e := range events {
			body, err := domain.MarshalEvent(e)
			if err != nil {
				firstErr = errors.Join(firstErr, err)
				p.futures = nil
				break
			}
			msg := &nats.Msg{Subject: r.cfg.Stream.Subject(e.StreamID), Data: body, Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, e.ID)
			f, err := r.js.PublishMsgAsync(msg, jetstream.WithExpectStream(r.cfg.Stream.Name))
			if err != nil {
				return 0, fmt.Errorf("publish %s v%d: %w", e.StreamID, e.Version, err)
			}
			p.futures = append(p.futures, f)
		}
		if len(p.futures) == len(d.Events) {
			rounds = append(rounds, p)
		}
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	var acked []bson.ObjectID
	events := 0
	for _, p := range rounds {
		ok := true
		for _, f := range p.futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				ok, firstErr = false, errors.Join(firstErr, err)
			case <-timeout.C:
				return 0, fmt.Errorf("wait for JetStream acks: timed out after %s", r.cfg.AckTimeout)
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		if ok {
			acked = append(acked, docs[p.commit].ID)
			events += len(p.futures)
		}
	}
	if len(acked) > 0 {
		now := domain.Timestamp(time.Now())
		_, err := r.store.commits.UpdateMany(ctx,
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: acked}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: now}}}})
		if err != nil {
			return 0, fmt.Errorf("mark %d commits published: %w", len(acked), translate(err))
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

// Backlog returns the number of unpublished commits and the age of the
// oldest one (0 when there is none).
func (r *Relay) Backlog(ctx context.Context) (int64, time.Duration, error) {
	filter := bson.D{{Key: "published", Value: false}}
	n, err := r.store.commits.CountDocuments(ctx, filter)
	if err != nil {
		return 0, 0, fmt.Errorf("count outbox: %w", translate(err))
	}
	if n == 0 {
		return 0, 0, nil
	}
	var oldest commitDoc
	err = r.store.commits.FindOne(ctx, filter, options.FindOne().SetSort(bson.D{{Key: "_id", Value: 1}}).
		SetProjection(bson.D{{Key: "recorded_at", Value: 1}})).Decode(&oldest)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read outbox head: %w", translate(err))
	}
	return n, time.Since(oldest.RecordedAt), nil
}

func (r *Relay) updateStats(ctx context.Context) {
	if r.metrics == nil {
		return
	}
	n, age, err := r.Backlog(ctx)
	if err != nil {
		return
	}
	r.metrics.unpublished.Set(float64(n))
	r.metrics.oldestAgeSecond.Set(age.Seconds())
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
