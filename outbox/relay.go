package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync/atomic"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
)

// Relay publishes every committed event to the bus at least once
// (invariant 3), from the log itself: one instance at a time, under the
// RelayLease, tails the log's change stream and publishes each commit's
// events in commit order, one JetStream message per event with
// Nats-Msg-Id = event id. A round is one batch of the stream; up to
// roundsInFlight rounds are sent before the oldest one's acks are waited
// for. Once JetStream has acknowledged a round (and every round before
// it), the relay saves the position after it, with the recorded time of
// its last commit, as its checkpoint: one write for the rounds whose acks
// it found in, at most every checkpointEvery while busy, fenced by the
// lease, so a deposed relay can move it neither back nor forward. An idle
// relay saves the stream's position every IdleCheckpoint.
//
// A crash, a failed round or a lost lease resumes from the checkpoint:
// what the next relay publishes again is dropped by JetStream's
// de-duplication window and, past it, by the projections' version guards.
//
// When the stream cannot resume from the checkpoint (domain.ErrHistoryLost:
// it fell off MongoDB's oplog, or the collection was re-created), the relay
// catches up from the log: it takes the time and opens the stream at the
// log's end, publishes the commits recorded since the checkpoint's recorded
// time less CatchUpMargin, each stream's in version order, and tails from
// where the stream opened. It logs that at ERROR and counts it; no path
// skips to "now". On a log with no checkpoint (a new log, or one an earlier
// version wrote, whose relay marked each commit published) it publishes
// the same way from the oldest commit not marked published.
//
// The relay publishes each event's stored payload in the wire form the
// log gives it (domain.RecordedCommit): it decodes no payload, which was
// checked when appended. A commit that this build cannot read (an event
// type or schema version it does not know) is logged at ERROR, counted as
// a publish error and passed over: the projections' gap fill reads it
// from the log and parks its stream as poison.
type Relay struct {
	log     Log
	pub     Publisher
	lease   Lease
	cfg     Config
	logger  *slog.Logger
	metrics *Metrics
	savedAt time.Time  // when this instance last saved a checkpoint
	sent    *positions // what it published under its claim of the lease; nil before a tail
}

// NewRelay returns a Relay from log to pub under lease (the RelayLease,
// made with cfg.LeaseTTL for this instance), recording its metrics in m
// (not nil).
func NewRelay(log Log, pub Publisher, lease Lease, cfg Config, logger *slog.Logger, m *Metrics) *Relay {
	cfg = cfg.WithDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Relay{log: log, pub: pub, lease: lease, cfg: cfg, logger: logger, metrics: m}
}

// roundsInFlight is how many publish rounds the relay has sent and awaits
// acks for at once: the next round is sent while the acks of the ones
// before come in. Waiting for each round's acks before sending the next
// held BenchmarkRelayPublish to about half the raw async publish rate.
const roundsInFlight = 4

// checkpointEvery is the least time between two checkpoints of a busy
// relay (an idle one saves its last rounds at once). Saved after every
// round, the checkpoints were 24 writes a second, 5 % of the embedded
// store's one writer, in BenchmarkSteadyLoad's steady phase. A relay that
// stops between two saves publishes at most this much again from the
// checkpoint before: copies that JetStream's de-duplication window drops.
const checkpointEvery = 250 * time.Millisecond

// standbyPoll is how often an instance without the lease whose NATS
// connection is down looks whether it is back, and maxRetryPause the
// longest pause between two failed attempts: a bus back from an outage is
// published to within about a second.
const (
	standbyPoll   = 100 * time.Millisecond
	maxRetryPause = time.Second
)

// shutdownGrace bounds what a stop waits for the acks of the rounds in
// flight and the checkpoint after them.
const shutdownGrace = 2 * time.Second

// Run claims the lease and, while it holds it, publishes the log, until
// ctx is done; it then releases the lease. Failures (store or NATS down)
// are logged and retried from the checkpoint; Run always returns nil.
//
// An instance that cannot do the work gives the lease up, so a healthy
// one takes over: when its NATS connection has been down for LeaseTTL/2
// (a client of a cluster reconnects to another node sooner), and when its
// rounds have failed for LeaseTTL/2 while the stream answered (it then
// claims no lease for one LeaseTTL). An outage of the bus itself (the
// stream does not answer) is every instance's: the relay keeps its lease
// through it and publishes as soon as the stream is back. A standby claims
// only while its NATS connection is up.
func (r *Relay) Run(ctx context.Context) error {
	var (
		leader     bool
		uncertain  bool      // the last claim or renewal failed: it may have landed
		offline    time.Time // since when NATS is not connected; zero when it is
		failing    time.Time // since when the leader's work fails while the stream answers
		restUntil  time.Time // no claims before, after giving the lease up
		backoff    time.Duration
		lastFailed error
		failedAt   time.Time // when lead last failed
	)
	defer func() {
		if leader || uncertain {
			r.standDown(ctx, "shutdown")
		}
	}()
	for ctx.Err() == nil {
		now := time.Now()
		connected := r.pub.Connected()
		switch {
		case connected:
			offline = time.Time{}
		case offline.IsZero():
			offline = now
		}
		if leader {
			reason := ""
			switch {
			case !connected && now.Sub(offline) > r.cfg.LeaseTTL/2:
				reason = "nats not connected"
			case !failing.IsZero() && now.Sub(failing) > r.cfg.LeaseTTL/2:
				reason = fmt.Sprintf("publishing failed for half the lease while the stream answered: %v", lastFailed)
				restUntil = now.Add(r.cfg.LeaseTTL)
			}
			if reason != "" {
				r.standDown(ctx, reason)
				leader, failing = false, time.Time{}
			}
		}
		if !leader && (now.Before(restUntil) || !connected) {
			pause.For(ctx, standbyPoll)
			continue
		}
		held, err := r.acquire(ctx)
		uncertain = err != nil
		if held != leader {
			r.logger.Info("relay lease changed", "leader", held, "owner", r.cfg.Owner)
			r.metrics.setLeader(held)
		}
		leader = held
		if !leader {
			pause.For(ctx, r.cfg.LeaseTTL/3)
			continue
		}
		err = r.lead(ctx)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, domain.ErrLeaseLost):
			r.logger.Info("relay lease lost", "owner", r.cfg.Owner)
			leader = false
			r.metrics.setLeader(false)
		case err != nil:
			if r.savedAt.After(failedAt) {
				backoff = 0 // it made progress since the last failure
			}
			lastFailed, failedAt = err, time.Now()
			if cerr := r.checkStream(ctx); cerr == nil {
				if failing.IsZero() || r.savedAt.After(failing) {
					failing = time.Now() // the first failure since the last progress
				}
			} else {
				failing = time.Time{} // an outage of the bus: not this instance's trouble
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), maxRetryPause)
			r.logger.Warn("relay failed; resuming from its checkpoint", "err", err, "retry_in", backoff)
			pause.For(ctx, backoff)
		}
	}
	return nil
}

// acquire claims or renews the lease, within LeaseTTL/2 whatever ctx does
// (a write cut off mid-flight may land after the release and hold the
// lease for a TTL).
func (r *Relay) acquire(ctx context.Context) (bool, error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL/2)
	defer cancel()
	held, err := r.lease.TryAcquire(lctx)
	if err != nil {
		r.logger.Warn("relay lease claim failed", "err", err)
	}
	return held, err
}

// checkStream asks the bus whether the stream answers, within a second at
// most: a stream that has a leader answers in milliseconds.
func (r *Relay) checkStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(r.cfg.LeaseTTL/4, maxRetryPause))
	defer cancel()
	return r.pub.CheckStream(ctx)
}

// standDown releases the lease, so a healthy standby claims it within a
// third of its TTL instead of after it.
func (r *Relay) standDown(ctx context.Context, reason string) {
	r.metrics.setLeader(false)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := r.lease.Release(ctx); err != nil {
		r.logger.Warn("relay lease not released; it expires", "reason", reason, "err", err)
		return
	}
	r.logger.Info("relay lease released", "reason", reason, "owner", r.cfg.Owner)
}

// lead publishes the log from the checkpoint while this instance holds
// the lease: it returns an error wrapping domain.ErrLeaseLost once it
// does not, ctx's error, or the error that ended the stream or a round.
func (r *Relay) lead(ctx context.Context) error {
	cp, err := r.lease.Checkpoint(ctx)
	if err != nil {
		return err
	}
	r.metrics.setCheckpoint(cp.RecordedAt)
	if cp.Token == nil {
		if cp, err = r.start(ctx, cp); err != nil {
			return err
		}
	}
	for {
		err := r.tail(ctx, cp)
		if !errors.Is(err, domain.ErrHistoryLost) {
			return err
		}
		since := cp.RecordedAt.Add(-r.cfg.CatchUpMargin)
		r.metrics.catchUps.Inc()
		r.metrics.lastCatchUp.SetToCurrentTime()
		r.logger.Error("relay cannot resume the log's change stream from its checkpoint; catching up from the log",
			"checkpoint_recorded_at", cp.RecordedAt, "since", since, "err", err)
		if cp, err = r.catchUp(ctx, since, cp); err != nil {
			return err
		}
	}
}

// start is the first start on a log without a checkpoint: it opens the
// stream at the log's end first, so that every commit from then on is in
// the stream, and then looks for what no relay has published (every
// commit from the oldest one not marked published by an earlier version,
// if any), which a catch-up publishes; otherwise it saves a checkpoint
// where the stream opened. Looked for the other way round, a commit
// appended between the look and the stream's opening would be in neither.
func (r *Relay) start(ctx context.Context, cp Checkpoint) (Checkpoint, error) {
	at := time.Now()
	pos, err := r.position(ctx)
	if err != nil {
		return cp, err
	}
	oldest, found, err := r.log.OldestUnpublished(ctx)
	if err != nil {
		return cp, err
	}
	if found {
		since := oldest.Add(-r.cfg.CatchUpMargin)
		r.logger.Info("relay starts on a log without a checkpoint; publishing it from its oldest unpublished commit",
			"oldest_recorded_at", oldest, "since", since)
		return r.catchUp(ctx, since, cp)
	}
	cp.Token, cp.RecordedAt = pos, at
	if err := r.save(ctx, cp); err != nil {
		return cp, err
	}
	r.logger.Info("relay starts on a log with nothing to publish; tailing it from its end")
	return cp, nil
}

// catchUp opens the stream at the log's end (the time taken before), then
// publishes every commit recorded since, and saves the stream's opening
// position as the checkpoint: every commit after it is in the stream, and
// every commit before it recorded since was published. The events the bus
// holds already keep the log positions they were published under; the
// others are numbered after the highest (Checkpoint).
func (r *Relay) catchUp(ctx context.Context, since time.Time, cp Checkpoint) (Checkpoint, error) {
	at := time.Now()
	pos, err := r.position(ctx)
	if err != nil {
		return cp, err
	}
	r.sent = nil // a tail after it reads what the catch-up published from the bus
	known, top, err := r.readPositions(ctx, since, cp.Position, 0)
	if err != nil {
		return cp, fmt.Errorf("catch up from the log: the positions published since %s: %w", since.Format(time.RFC3339), err)
	}
	before := len(known.events)
	cp.Position = top
	start, commits := time.Now(), 0
	err = r.log.RecordedSince(ctx, since, r.cfg.BatchSize, func(batch []domain.RecordedCommit) error {
		if err := r.renewDue(ctx); err != nil {
			return err
		}
		rd := r.send(ctx, batch, nil, cp.Position, known)
		res := <-rd.done
		if err := rd.failed(res); err != nil {
			return err
		}
		cp.Position = rd.position
		cp.Seq = max(cp.Seq, res.seq)
		commits += len(batch)
		return nil
	})
	if err != nil {
		return cp, fmt.Errorf("catch up from the log since %s: %w", since.Format(time.RFC3339), err)
	}
	cp.Token, cp.RecordedAt = pos, at
	if err := r.save(ctx, cp); err != nil {
		return cp, err
	}
	r.logger.Info("relay caught up from the log", "commits", commits, "published_before", before, "top", top, "position", cp.Position, "since", since, "took", time.Since(start).Round(time.Millisecond))
	return cp, nil
}

// positions are the log positions of the events a relay has published
// under one claim of its lease (epoch), by event id, each with the round
// that sent it last; those the bus held when the first tail under the
// claim began are kept until a round sends them again. A tail that
// starts again under the same claim gives the events it sends again
// their positions from here instead of reading them back from the bus,
// which right after a NATS election timed out for seconds at a time
// (docs/relay.md, "A restart under the same lease"). Another holder's
// claim raises the epoch, so what this holder remembers covers every
// event published since its checkpoint: its own and what the bus held
// when it began.
type positions struct {
	epoch  int64
	rounds uint64 // rounds sent under the claim
	events map[string]sentAt
}

type sentAt struct{ position, round uint64 }

// readPositions reads from the bus the positions of the events it has
// stored since since, for a tail or catch-up under the claim of epoch,
// and the highest of them, at least floor.
func (r *Relay) readPositions(ctx context.Context, since time.Time, floor uint64, epoch int64) (*positions, uint64, error) {
	known, top, err := r.pub.Positions(ctx, since, floor)
	if err != nil {
		r.metrics.publishErrors.Inc()
		return nil, 0, err
	}
	p := &positions{epoch: epoch, events: make(map[string]sentAt, len(known))}
	for id, pos := range known {
		p.events[id] = sentAt{pos, math.MaxUint64}
	}
	return p, top, nil
}

// first returns the log position of the first of a commit's events when
// one of them was published: the commit was published as a whole, its
// events at consecutive positions.
func (p *positions) first(events []domain.EventMessage) (uint64, bool) {
	for i, e := range events {
		if s, ok := p.events[e.ID]; ok && s.position > uint64(i) {
			return s.position - uint64(i), true
		}
	}
	return 0, false
}

// errOpened stops the stream position reads once it has opened.
var errOpened = errors.New("opened")

// position returns the log's end: where a change stream opened now starts.
func (r *Relay) position(ctx context.Context) ([]byte, error) {
	var pos []byte
	err := r.log.Tail(ctx, nil, 1, func(_ []domain.RecordedCommit, next []byte) error {
		pos = next
		return errOpened
	})
	if !errors.Is(err, errOpened) {
		return nil, err
	}
	if pos == nil {
		return nil, errors.New("the log's change stream opened without a position")
	}
	return pos, nil
}

// round is one batch of commits sent to the bus.
type round struct {
	n        uint64        // its number among the rounds sent under the lease's claim (positions)
	commits  int           // commits in the batch, read or not
	sent     int           // commits published (the readable ones)
	next     []byte        // the stream's position after the batch; nil in a catch-up
	position uint64        // the log position of its last event
	first    time.Time     // recorded time of its first and last commit
	last     time.Time     //
	done     chan ackState // the acks, once in
	acked    atomic.Bool   // every commit acknowledged: the lag gauges count it no more
}

type ackState struct {
	acked int
	seq   uint64 // stream sequence of the last event acknowledged
	err   error
}

// failed is the error of a round whose every commit was not acknowledged.
func (rd *round) failed(res ackState) error {
	if res.acked == rd.sent && res.err == nil {
		return nil
	}
	if res.err == nil {
		res.err = errors.New("not acknowledged")
	}
	return fmt.Errorf("%d of %d commits published: %w", res.acked, rd.sent, res.err)
}

// send sends the readable commits of batch, their events at the log
// positions after position (those known, by event id, at theirs; it
// records them all in known), and returns the round, whose done receives
// the outcome of their acks. A commit is numbered from the last position
// of the commit before it, published or not, so a tail numbers the
// commits after its checkpoint as every tail from that checkpoint did,
// also those a round lost in a NATS election while a later one got
// through (docs/relay.md, "Log positions"). A
// commit that cannot be read keeps its events' positions, so that the
// positions do not depend on what this build can read.
func (r *Relay) send(ctx context.Context, batch []domain.RecordedCommit, next []byte, position uint64, known *positions) *round {
	known.rounds++
	rd := &round{n: known.rounds, commits: len(batch), next: next, done: make(chan ackState, 1)}
	commits := make([]domain.RecordedCommit, 0, len(batch))
	positions := make([]uint64, 0, len(batch))
	recorded := make([]time.Time, 0, len(batch))
	n := 0
	for _, c := range batch {
		first, published := known.first(c.Events)
		if !published {
			first = position + 1
		}
		position = max(position, first+uint64(c.Count)-1)
		for i, e := range c.Events {
			known.events[e.ID] = sentAt{first + uint64(i), rd.n}
		}
		if rd.first.IsZero() {
			rd.first = c.RecordedAt
		}
		if c.RecordedAt.After(rd.last) {
			rd.last = c.RecordedAt
		}
		if c.Err != nil {
			r.logger.Error("commit cannot be read; it is not published", "commit", c.ID, "err", c.Err)
			r.metrics.publishErrors.Inc()
			continue
		}
		commits = append(commits, c)
		positions = append(positions, first)
		recorded = append(recorded, c.RecordedAt)
		n += len(c.Events)
	}
	rd.sent, rd.position = len(commits), position
	if len(commits) == 0 {
		rd.done <- ackState{}
		return rd
	}
	tail := next != nil // a catch-up's commits are old: their ages would say nothing of the tail's
	if tail {
		r.metrics.observeAge(stageRead, recorded)
	}
	wait := r.pub.Send(ctx, commits, positions, min(r.cfg.AckTimeout, r.cfg.LeaseTTL/4))
	go func() {
		acked, seq, err := wait()
		if len(acked) == len(commits) && err == nil {
			rd.acked.Store(true)
			r.metrics.published.Add(float64(n))
		} else {
			r.metrics.publishErrors.Inc()
		}
		if tail {
			ackedAt := make([]time.Time, len(acked))
			for k, i := range acked {
				ackedAt[k] = recorded[i]
			}
			r.metrics.observeAge(stageAcknowledged, ackedAt)
		}
		rd.done <- ackState{acked: len(acked), seq: seq, err: err}
	}()
	return rd
}

// renewDue renews the lease when a third of its TTL has passed since the
// last claim or renewal that got through: an error wrapping
// domain.ErrLeaseLost when another instance holds it now.
func (r *Relay) renewDue(ctx context.Context) error {
	if held, ok := r.lease.Held(); ok && time.Since(held.RenewedAt) < r.cfg.LeaseTTL/3 {
		return nil
	}
	held, err := r.acquire(ctx)
	if err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("renew the relay lease: %w", domain.ErrLeaseLost)
	}
	return nil
}

// save writes the checkpoint, fenced by the lease: domain.ErrLeaseLost when
// another instance holds it now.
func (r *Relay) save(ctx context.Context, cp Checkpoint) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL/2)
	defer cancel()
	if err := r.lease.SaveCheckpoint(sctx, cp); err != nil {
		return fmt.Errorf("save the relay checkpoint: %w", err)
	}
	r.metrics.setCheckpoint(cp.RecordedAt)
	r.savedAt = time.Now()
	return nil
}

// tail publishes the log's change stream from cp until ctx is done, the
// lease is lost or a round or the stream fails.
func (r *Relay) tail(ctx context.Context, cp Checkpoint) error {
	// The commits after the checkpoint may have been published already:
	// by the relay before this one, or by a catch-up that opened the
	// stream here before it read the log. They keep their positions.
	held, _ := r.lease.Held()
	if r.sent == nil || r.sent.epoch != held.Epoch || held.Epoch == 0 {
		known, _, err := r.readPositions(ctx, cp.RecordedAt.Add(-r.cfg.CatchUpMargin), cp.Position, held.Epoch)
		if err != nil {
			return fmt.Errorf("the positions published since the checkpoint: %w", err)
		}
		r.sent = known
	}
	t := tailer{Relay: r, savedAt: time.Now(), saved: cp, position: cp.Position}
	err := r.log.Tail(ctx, cp.Token, r.cfg.BatchSize, t.batch)
	// The rounds acknowledged before the end keep their checkpoint; the
	// others are published again from it.
	if errors.Is(err, domain.ErrLeaseLost) {
		return err
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if serr := t.settle(gctx, true); serr != nil && err == nil {
		err = serr
	}
	r.metrics.setBehind(nil)
	return err
}

// tailer is one tail's state: the rounds in flight and when it last saved
// a checkpoint.
type tailer struct {
	*Relay
	inFlight []*round
	acked    *round     // the last round acknowledged and not yet saved; nil when none
	ackedSeq uint64     // the stream sequence of its last event
	saved    Checkpoint // as last saved (or the tail began from)
	position uint64     // the log position of the last event sent
	savedAt  time.Time  // when the last checkpoint was saved (or the tail began)
	polledAt time.Time  // when the last batch was handed back to the stream
}

// batch is Tail's callback: it sends commits as a round, settles the
// oldest round once roundsInFlight are in flight, and settles every round
// and saves an idle checkpoint when the stream has nothing new.
func (t *tailer) batch(commits []domain.RecordedCommit, next []byte) error {
	// polledAt is before the stream's read of this batch began: every
	// commit after next is recorded after it, less the margin.
	polled := t.polledAt
	defer func() { t.polledAt = time.Now() }()
	ctx := context.Background()
	if err := t.renewDue(ctx); err != nil {
		return err
	}
	if len(commits) == 0 {
		if err := t.settle(ctx, true); err != nil {
			return err
		}
		t.metrics.setBehind(nil)
		// On time alone, whether or not the position moved: MongoDB's
		// postBatchResumeToken advances with the cluster's time while
		// nothing is inserted, the embedded store's stays at the last
		// insert, and the saved time is what tells an operator the relay
		// is alive (outbox.RelayStatus).
		if next != nil && !polled.IsZero() && time.Since(t.savedAt) >= t.cfg.IdleCheckpoint {
			cp := t.saved
			cp.Token, cp.RecordedAt = next, polled
			if err := t.save(ctx, cp); err != nil {
				return err
			}
			t.saved, t.savedAt = cp, time.Now()
		}
		return nil
	}
	rd := t.send(ctx, commits, next, t.position, t.sent)
	t.position = rd.position
	t.inFlight = append(t.inFlight, rd)
	t.metrics.setBehind(t.inFlight)
	if len(t.inFlight) >= roundsInFlight {
		return t.settle(ctx, false)
	}
	return nil
}

// settle waits for the oldest round's acks (for every round's, with all)
// and takes the rounds after it whose acks are in, then saves one
// checkpoint after the last of them and of those acknowledged before and
// not yet saved: with all at once, without it at most every
// checkpointEvery (checkpoint). An error: a round failed, or the
// checkpoint was not saved (domain.ErrLeaseLost when the lease has passed).
func (t *tailer) settle(ctx context.Context, all bool) error {
	last, seq := t.acked, max(t.saved.Seq, t.ackedSeq)
	for waited := false; len(t.inFlight) > 0; waited = true {
		rd := t.inFlight[0]
		var res ackState
		if !waited || all {
			select {
			case res = <-rd.done:
			case <-ctx.Done():
				t.inFlight = nil
				return t.checkpoint(ctx, last, seq, ctx.Err(), true)
			}
		} else {
			select {
			case res = <-rd.done:
			default:
				return t.checkpoint(ctx, last, seq, nil, false)
			}
		}
		if err := rd.failed(res); err != nil {
			// The rounds after it are published again from the checkpoint.
			t.inFlight = nil
			return t.checkpoint(ctx, last, seq, err, true)
		}
		t.inFlight = t.inFlight[1:]
		last, seq = rd, max(seq, res.seq)
	}
	return t.checkpoint(ctx, last, seq, nil, all)
}

// checkpoint saves the position after last, the last round acknowledged
// (none: nothing to save), with seq, the stream sequence of the last
// event acknowledged, and returns err, or the save's error. Unless now
// (a round failed, the tail ends or the stream is idle), it saves at most
// every checkpointEvery and otherwise keeps last for the next save.
func (t *tailer) checkpoint(ctx context.Context, last *round, seq uint64, err error, now bool) error {
	if last == nil {
		return err
	}
	if err == nil && !now && time.Since(t.savedAt) < checkpointEvery {
		t.acked, t.ackedSeq = last, seq
		return nil
	}
	t.acked = nil
	cp := Checkpoint{Token: last.next, RecordedAt: last.last, Position: last.position, Seq: seq}
	if serr := t.save(ctx, cp); serr != nil {
		return errors.Join(err, serr)
	}
	t.saved, t.savedAt = cp, time.Now()
	// A tail starting again resumes after this checkpoint: the events last
	// sent in its round or before are forgotten, a scan of every event
	// remembered at most once per checkpoint (checkpointEvery).
	maps.DeleteFunc(t.sent.events, func(_ string, s sentAt) bool { return s.round <= last.n })
	return err
}
