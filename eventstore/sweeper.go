package eventstore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/eventstore/mongoerr"
)

// SweepLease is the name of the lease under which one Sweeper at a time
// sweeps the outbox.
const SweepLease = "relay"

// Sweeper publishes the commits that their appending instance left
// unpublished (invariant 3): it crashed between the insert and the
// publish or the marker, its queue was full, or NATS was down. Each sweep
// reads the oldest commits {published: false} whose recorded_at is older
// than SweepGrace (an index range on (published, recorded_at) on
// MongoDB), publishes them as the Relay does and marks them. The grace
// keeps it from racing the appending instance's own publish; a race it
// loses anyway only publishes copies that the de-duplication window drops.
//
// One Sweeper sweeps at a time, under the "relay" Lease (invariant 6);
// the others stand by and claim it every LeaseTTL/3. A sweeper that cannot
// do its work gives the lease up so a healthy instance takes over: at
// once when its NATS connection is not connected, and after LeaseTTL/2
// in which no round marked a commit while commits wait (it then claims no
// lease for one LeaseTTL). A round lasts at most LeaseTTL/2, so renewals
// stay on time.
type Sweeper struct {
	out   outbox
	cfg   RelayConfig
	lease *Lease
}

// NewSweeper returns a Sweeper of db's event log publishing to js, its
// lease owned by cfg.Owner.
func NewSweeper(db *mongo.Database, js jetstream.JetStream, cfg RelayConfig, log *slog.Logger, m *Metrics) *Sweeper {
	cfg.setDefaults()
	return &Sweeper{
		out:   newOutbox(db, js, cfg.Stream, log, m),
		cfg:   cfg,
		lease: NewLease(db, SweepLease, cfg.Owner, cfg.LeaseTTL),
	}
}

// Run sweeps while it holds the lease, until ctx is done, then releases
// the lease. Failed rounds and claims (store or NATS down) are logged and
// retried; Run always returns nil.
func (s *Sweeper) Run(ctx context.Context) error {
	var (
		leader     bool
		renewedAt  time.Time
		progressAt time.Time // last round that marked commits or found none
		backlog    bool      // the last round left commits behind
		restUntil  time.Time // no claims before, after giving the lease up
		backoff    time.Duration
	)
	defer func() {
		if leader {
			s.standDown(context.WithoutCancel(ctx), "shutdown")
		}
	}()
	for ctx.Err() == nil {
		now := time.Now()
		if leader {
			reason := ""
			switch {
			case !s.connected():
				reason = "nats not connected"
			case backlog && now.Sub(progressAt) > s.cfg.LeaseTTL/2:
				reason = "no commit marked within half the lease"
				restUntil = now.Add(s.cfg.LeaseTTL)
			}
			if reason != "" {
				s.standDown(ctx, reason)
				leader = false
			}
		}
		renew := leader && now.Sub(renewedAt) >= s.cfg.LeaseTTL/3
		claim := !leader && now.After(restUntil) && s.connected()
		if renew || claim {
			held, err := s.lease.TryAcquire(ctx)
			if err != nil && ctx.Err() == nil {
				s.out.log.Warn("relay sweep lease claim failed", "err", err)
			}
			held = held && err == nil
			if held != leader {
				s.out.log.Info("relay sweep lease changed", "leader", held, "owner", s.cfg.Owner)
			}
			if held && !leader {
				progressAt, backlog, backoff = now, false, 0
			}
			leader, renewedAt = held, now
			s.out.metrics.setLeader(leader)
		}
		wait := s.cfg.LeaseTTL / 3
		if leader {
			read, marked, err := s.sweep(ctx, s.cfg.SweepGrace, min(s.cfg.AckTimeout, s.cfg.LeaseTTL/2))
			if marked > 0 {
				// Part of a failed round still counts: a slow store
				// that marks a part of each batch is making progress.
				progressAt = time.Now()
			}
			switch {
			case err != nil && ctx.Err() == nil:
				backlog = true
				backoff = min(max(2*backoff, 50*time.Millisecond), s.cfg.SweepInterval)
				s.out.log.Warn("outbox sweep failed", "err", err, "retry_in", backoff)
				wait = backoff
			case err == nil:
				backlog, progressAt, backoff = false, time.Now(), 0
				if read == s.cfg.BatchSize && marked > 0 {
					continue // more to do
				}
				wait = s.cfg.SweepInterval
			}
		}
		sleep(ctx, wait)
	}
	return nil
}

// connected reports whether the NATS connection can publish now.
func (s *Sweeper) connected() bool {
	nc := s.out.js.Conn()
	return nc != nil && nc.IsConnected()
}

// standDown releases the lease, so a healthy standby claims it within a
// third of its TTL instead of after it.
func (s *Sweeper) standDown(ctx context.Context, reason string) {
	s.out.metrics.setLeader(false)
	ctx, cancel := context.WithTimeout(ctx, shutdownGrace)
	defer cancel()
	if err := s.lease.Release(ctx); err != nil {
		s.out.log.Warn("relay sweep lease not released; it expires", "reason", reason, "err", err)
		return
	}
	s.out.log.Info("relay sweep lease released", "reason", reason, "owner", s.cfg.Owner)
}

// PublishPending sweeps once, now and without the lease: it publishes the
// up to BatchSize oldest unpublished commits, whatever their age, and
// marks the acknowledged ones published. It returns how many commits it
// read; the ones not acknowledged stay unpublished and are read again by
// the next call. For tests and tools: beside a running Relay it may
// publish a commit twice, which de-duplication absorbs.
func (s *Sweeper) PublishPending(ctx context.Context) (int, error) {
	read, _, err := s.sweep(ctx, 0, s.cfg.AckTimeout)
	return read, err
}

// sweep publishes the oldest unpublished commits recorded more than grace
// ago, up to a batch, and records what it found in the backlog metrics.
// It returns how many commits it read and how many it marked published.
func (s *Sweeper) sweep(ctx context.Context, grace, ackTimeout time.Duration) (read, marked int, err error) {
	filter := bson.D{{Key: "published", Value: false}}
	if grace > 0 {
		filter = append(filter, bson.E{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: time.Now().Add(-grace)}}})
	}
	cur, err := s.out.commits.Find(ctx, filter,
		options.Find().SetSort(bson.D{{Key: "recorded_at", Value: 1}}).SetLimit(int64(s.cfg.BatchSize)))
	if err != nil {
		return 0, 0, fmt.Errorf("read outbox: %w", mongoerr.Translate(err))
	}
	var docs []commitDoc
	if err := cur.All(ctx, &docs); err != nil {
		return 0, 0, fmt.Errorf("read outbox: %w", mongoerr.Translate(err))
	}
	var oldest time.Time
	if len(docs) > 0 {
		oldest = docs[0].RecordedAt
	}
	s.out.metrics.setOutbox(len(docs), oldest)
	if len(docs) == 0 {
		return 0, 0, nil
	}
	marked, err = s.out.publish(ctx, docs, ackTimeout)
	return len(docs), marked, err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
