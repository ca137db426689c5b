package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
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
// do its work gives the lease up so a healthy instance takes over: when
// its NATS connection has not been connected for LeaseTTL/2 (a client of
// a cluster reconnects to another node sooner), and when no round marked a
// commit for LeaseTTL/2 while commits wait although the stream answered
// after each failed round (it then claims no lease for one LeaseTTL). An
// outage of the bus itself (the stream does not answer, or its cluster is
// electing a leader) is every instance's: the sweeper keeps its lease
// through it, retries at most a second apart, and publishes as soon as
// the stream is back. A standby whose connection comes back claims the
// lease at once. A round's acks and its markers each take at most
// LeaseTTL/4, and an idle sweeper's pace spaces its reads but not its
// renewals, so renewals stay on time. An outbox read is not bounded (on
// the embedded store it decodes the whole log); one that outlasts a
// renewal period is followed by a renewal before anything it read is
// published, so a sweeper whose lease was taken meanwhile publishes none
// of it.
type Sweeper struct {
	out   relay
	cfg   Config
	lease Lease
}

// NewSweeper returns a Sweeper of commits publishing through pub, under
// lease: the SweepLease, made with cfg.LeaseTTL for this instance.
func NewSweeper(commits Commits, pub Publisher, lease Lease, cfg Config, log *slog.Logger, m *Metrics) *Sweeper {
	cfg.setDefaults()
	return &Sweeper{out: newRelay(commits, pub, log, m), cfg: cfg, lease: lease}
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
		pending    []domain.RecordedCommit // read by the last outbox read, not yet published
		reads      readCosts               // how long the last outbox reads took
		readAt     time.Time               // idle: no outbox read before
		uncertain  bool                    // the last claim or renewal failed
		offline    time.Time               // since when NATS is not connected; zero when it is
		outageAt   time.Time               // when the stream last did not answer after a failed round
	)
	defer func() {
		// A claim that failed may still have landed: releasing a lease
		// this owner does not hold changes nothing.
		if leader || uncertain {
			s.standDown(ctx, "shutdown")
		}
	}()
	for ctx.Err() == nil {
		now := time.Now()
		connected := s.out.pub.Connected()
		switch {
		case connected:
			offline = time.Time{}
		case offline.IsZero():
			offline = now
		}
		if leader {
			reason := ""
			switch {
			case !connected && now.Sub(offline) > s.cfg.LeaseTTL/2:
				reason = "nats not connected"
			case connected && backlog && now.Sub(progressAt) > s.cfg.LeaseTTL/2 && now.Sub(outageAt) > s.cfg.LeaseTTL/2:
				// The stream answered after every failed round of the
				// last half lease: the trouble is this instance's.
				reason = "no commit marked within half the lease"
				restUntil = now.Add(s.cfg.LeaseTTL)
			}
			if reason != "" {
				s.standDown(ctx, reason)
				leader, pending = false, nil
			}
		}
		renew := leader && now.Sub(renewedAt) >= s.cfg.LeaseTTL/3
		claim := !leader && now.After(restUntil) && connected
		if renew || claim {
			// Not cancelled by shutdown: a write cut off mid-flight may
			// land after the release and hold the lease for a TTL.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.LeaseTTL/2)
			held, err := s.lease.TryAcquire(lctx)
			cancel()
			uncertain = err != nil
			if err != nil {
				s.out.log.Warn("relay sweep lease claim failed", "err", err)
			}
			held = held && err == nil
			if held != leader {
				s.out.log.Info("relay sweep lease changed", "leader", held, "owner", s.cfg.Owner)
			}
			if held && !leader {
				progressAt, backlog, backoff, readAt = now, false, 0, time.Time{}
			}
			leader, renewedAt = held, now
			if !leader {
				pending = nil
			}
			s.out.metrics.setLeader(leader)
		}
		wait := s.cfg.LeaseTTL / 3
		if !leader && !connected {
			// Claim as soon as the connection is back.
			wait = min(wait, standbyPoll)
		}
		// The pace of an idle sweeper spaces its reads, not its renewals:
		// a pace above a renewal period would let its lease lapse.
		untilRenewal := func() time.Duration { return max(0, time.Until(renewedAt.Add(s.cfg.LeaseTTL/3))) }
		if leader && len(pending) == 0 && time.Now().Before(readAt) {
			pause.For(ctx, min(time.Until(readAt), untilRenewal()))
			continue
		}
		if leader {
			var (
				marked int
				err    error
			)
			if len(pending) == 0 {
				start := time.Now()
				pending, err = s.readOutbox(ctx, s.cfg.SweepGrace, sweepBatches*s.cfg.BatchSize)
				if err == nil {
					reads.add(time.Since(start))
				}
				if err == nil && len(pending) > 0 && time.Since(renewedAt) >= s.cfg.LeaseTTL/3 {
					// The read outlasted a renewal period (it waited out
					// an outage or an election): renew first, and drop
					// what it read if the lease has gone meanwhile.
					continue
				}
			}
			if err == nil && len(pending) > 0 {
				batch := pending[:min(len(pending), s.cfg.BatchSize)]
				marked, err = s.out.publish(ctx, batch, min(s.cfg.AckTimeout, s.cfg.LeaseTTL/4))
				pending = pending[len(batch):]
				if marked > 0 {
					// Part of a failed round still counts: a slow store
					// that marks a part of each batch is making progress.
					progressAt = time.Now()
				}
				if err != nil || len(pending) == 0 {
					// Read again: what failed is still unpublished, and a
					// full read may have left more behind.
					pending = pending[:0]
				}
			}
			switch {
			case err != nil && ctx.Err() == nil:
				backlog = true
				if cerr := s.checkStream(ctx); errors.Is(cerr, domain.ErrUnavailable) {
					// An outage of the bus: another instance could publish
					// no better.
					if time.Since(outageAt) > s.cfg.LeaseTTL/2 {
						s.out.log.Warn("relay sweep keeps its lease through a bus outage", "err", cerr)
					}
					outageAt = time.Now()
				}
				backoff = min(max(2*backoff, 50*time.Millisecond), s.cfg.SweepInterval, maxRetryPause)
				s.out.log.Warn("outbox sweep failed", "err", err, "retry_in", backoff)
				wait = backoff
			case err == nil:
				backlog, progressAt, backoff = false, time.Now(), 0
				if marked > 0 {
					continue // more may wait
				}
				readAt = time.Now().Add(max(s.cfg.SweepInterval, sweepSpacing*reads.least()))
				wait = min(time.Until(readAt), untilRenewal())
			}
		}
		pause.For(ctx, wait)
	}
	return nil
}

// standbyPoll is how often a sweeper without the lease whose NATS
// connection is down looks whether it is back, and maxRetryPause the
// longest pause between two failed rounds: a bus back from an outage is
// published to within about a second.
const (
	standbyPoll   = 100 * time.Millisecond
	maxRetryPause = time.Second
)

// checkStream asks the bus whether the stream answers, within a second
// at most (see Publisher.CheckStream): a stream that has a leader answers
// in milliseconds.
func (s *Sweeper) checkStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.LeaseTTL/4, maxRetryPause))
	defer cancel()
	return s.out.pub.CheckStream(ctx)
}

// standDown releases the lease, so a healthy standby claims it within a
// third of its TTL instead of after it.
func (s *Sweeper) standDown(ctx context.Context, reason string) {
	s.out.metrics.setLeader(false)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
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
	docs, err := s.readOutbox(ctx, 0, s.cfg.BatchSize)
	if err != nil || len(docs) == 0 {
		return 0, err
	}
	_, err = s.out.publish(ctx, docs, s.cfg.AckTimeout)
	return len(docs), err
}

// sweepBatches is how many batches one outbox read returns: on the
// embedded store every read decodes the whole collection, so one read
// feeds several rounds; on MongoDB it is an index range scan.
const sweepBatches = 16

// sweepSpacing is the least pause between two outbox reads that found
// nothing left to publish, as a multiple of what a read costs (see
// readCosts): the embedded store answers {published: false} by decoding
// every commit in Go (12.5 s at 50,000 commits, measured on a busy 2-core
// machine), so an idle sweeper spends at most a tenth of a core on it. On
// MongoDB a read takes milliseconds and SweepInterval decides.
const sweepSpacing = 10

// readCosts holds the durations of the last len(readCosts) successful
// outbox reads. What a read costs is the least of them: a read issued
// while the store is down, or in flight when it goes down, waits for it to
// come back (in the driver's server selection, or its retry of the read)
// and then succeeds, and its duration is the outage's. Paced by it, a
// sweeper would leave a commit unpublished for ten times the outage after
// the store is back (TestSweeperPaceAfterAReadThatWaitedOutAnOutage).
type readCosts [4]time.Duration

// add records a read's duration in place of the oldest.
func (r *readCosts) add(d time.Duration) {
	copy(r[1:], r[:len(r)-1])
	r[0] = d
}

// least returns the least recorded duration, 0 before the first read.
func (r *readCosts) least() time.Duration {
	least := r[0]
	for _, d := range r[1:] {
		if d > 0 && (least == 0 || d < least) {
			least = d
		}
	}
	return least
}

// readOutbox returns the up to limit oldest unpublished commits recorded
// more than grace ago, and records what it found in the backlog metrics.
func (s *Sweeper) readOutbox(ctx context.Context, grace time.Duration, limit int) ([]domain.RecordedCommit, error) {
	var before time.Time
	if grace > 0 {
		before = time.Now().Add(-grace)
	}
	commits, err := s.out.commits.Pending(ctx, before, limit)
	if err != nil {
		return nil, err
	}
	var oldest time.Time
	if len(commits) > 0 {
		oldest = commits[0].RecordedAt
	}
	s.out.metrics.setOutbox(len(commits), oldest)
	return commits, nil
}
