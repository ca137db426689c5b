package projector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// refillChunk bounds how many messages one read of the stream fills a gap
// with; a longer gap is filled a chunk at a time.
const refillChunk = 1024

// refillScan bounds how far past a gap's sequences, and before them,
// readStream looks for it.
const refillScan = 4 * refillChunk

// handleSequenced applies one batch of a Sequenced projection's messages
// in log position order. A gap its Apply names (deliveries a process that
// held the consumer before had received, a collection behind the others,
// or positions the relay published again after later ones when a round
// was lost in a NATS election) is read from the stream, a chunk at a
// time, and applied with the batch. Positions the stream no longer holds
// are lost (Sequenced.Lost); positions it never held are waited for, the
// batch redelivered, for lostAfter, and then lost. Every message is then acknowledged, but for the
// whole batch's redelivery after a failure that may pass, and but for
// the deliveries that cannot be counted, which are parked.
func (r *Runner) handleSequenced(ctx context.Context, pt *partition, msgs []arrival) {
	ds := make([]projection.Delivery, len(msgs))
	for i, a := range msgs {
		ds[i] = delivery(a.msg.Data(), bus.Position(a.msg.Headers()), 0)
		if md, err := a.msg.Metadata(); err == nil {
			ds[i].Seq = md.Sequence.Stream
		}
	}
	run := slices.SortedFunc(slices.Values(ds), byPosition)
	wctx, done := r.writeContext(ctx)
	defer done()
	var (
		out    projection.Outcome
		poison map[int]error
		err    error
	)
	for {
		out, poison, err = r.seq.Apply(wctx, run)
		var gap *projection.GapError
		if !errors.As(err, &gap) {
			break
		}
		filled, deleted, ferr := r.readStream(wctx, gap)
		if ferr != nil {
			err = ferr
			break
		}
		if len(filled) == 0 || filled[0].Position != gap.From {
			if since := r.gapSince(gap); !deleted && time.Since(since) < lostAfter {
				err = fmt.Errorf("%w: not in the stream yet, waiting since %s", gap, since.Format(time.RFC3339))
				break
			}
			r.setLastError(gap)
			r.log.Error("rollup log positions lost: neither delivered nor in the stream; a build from the log repairs it",
				"collection", gap.Collection, "from", gap.From, "to", gap.To, "after_seq", gap.AfterSeq, "before_seq", gap.BeforeSeq)
			if lerr := r.seq.Lost(wctx, gap); lerr != nil {
				err = lerr
				break
			}
			continue // the collection is set aside; the others go on
		}
		r.gapFilled(gap)
		run = mergeByPosition(filled, run)
	}
	pt.applied.Add(int64(out.Applied))
	r.metrics.partitionApplied(r.name, pt.p, out.Applied)
	if err != nil {
		r.redeliver(ctx, msgs, err)
		return
	}
	// A delivery that cannot be counted is parked at once: redelivered,
	// it would not count either. One read from the stream to fill a gap
	// is parked by the process it was delivered to, or after its
	// redelivery here.
	for k, cause := range poison {
		d := run[k]
		i := slices.IndexFunc(ds, func(x projection.Delivery) bool { return x.Seq == d.Seq })
		if i >= 0 && !r.park(ctx, msgs[i].msg, d.Event.StreamID, cause) {
			r.redeliver(ctx, msgs, nil)
			return
		}
	}
	for _, m := range msgs {
		_ = m.msg.Ack()
	}
}

// delivery decodes a message of the stream.
func delivery(data []byte, position, seq uint64) projection.Delivery {
	e, err := domain.UnmarshalEvent(data)
	return projection.Delivery{Event: e, Err: err, Position: position, Seq: seq}
}

// lostAfter is how long a rollup waits for log positions the stream does
// not hold before it calls them lost: a relay that lost a round in a NATS
// election while a later one got through publishes it again, at the same
// positions, within seconds (docs/relay.md, "A restart under the same
// lease"); a build from the log repairs a rollup that lost positions.
const lostAfter = 2 * time.Minute

// gapSince returns when the gap starting at gap.From in gap.Collection
// was first found missing from the stream.
func (r *Runner) gapSince(gap *projection.GapError) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := projection.GapError{Collection: gap.Collection, From: gap.From}
	if _, ok := r.gaps[key]; !ok {
		r.gaps[key] = time.Now()
	}
	return r.gaps[key]
}

// gapFilled forgets a gap the stream holds.
func (r *Runner) gapFilled(gap *projection.GapError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gaps, projection.GapError{Collection: gap.Collection, From: gap.From})
}

// byPosition orders deliveries by log position, then stream sequence.
func byPosition(a, b projection.Delivery) int {
	return cmp.Or(cmp.Compare(a.Position, b.Position), cmp.Compare(a.Seq, b.Seq))
}

// mergeByPosition merges two runs sorted by position, keeping one of
// the deliveries at a stream sequence both hold.
func mergeByPosition(a, b []projection.Delivery) []projection.Delivery {
	out := slices.Concat(a, b)
	slices.SortStableFunc(out, byPosition)
	seen := map[uint64]bool{}
	return slices.DeleteFunc(out, func(d projection.Delivery) bool {
		dup := seen[d.Seq]
		seen[d.Seq] = true
		return dup
	})
}

// readStream reads from the stream the messages of the gap's first
// refillChunk log positions (a longer gap is filled a chunk at a time),
// one message a position, sorted by position. It looks after
// gap.AfterSeq first, up to refillScan messages past gap.BeforeSeq or the
// stream's last (a relay publishing a lost round again sends it after the
// rounds in flight with it, 4 of up to 256 commits), then back from
// gap.AfterSeq to refillScan messages before the lower of the two
// sequences: when the event before the gap is one of such a round, the
// positions after it were published first, at lower sequences
// (TestSequencedRunnerFillsGapsBelowTheSequenceBeforeThem). It stops once
// it has every position it looks for, and passes over the messages the
// stream no longer holds. deleted reports that one of them is between
// gap.AfterSeq and gap.BeforeSeq: the gap's positions may have been
// there. Errors: JetStream's, but for a message not found.
func (r *Runner) readStream(ctx context.Context, gap *projection.GapError) (out []projection.Delivery, deleted bool, err error) {
	st, err := r.js.Stream(ctx, r.cfg.Stream) // its info read with it: its last sequence now
	if err != nil {
		return nil, false, fmt.Errorf("stream %s: %w", r.cfg.Stream, err)
	}
	info := st.CachedInfo()
	to := min(gap.To, gap.From+refillChunk-1)
	found := map[uint64]bool{}
	lo, hi := min(gap.AfterSeq, gap.BeforeSeq), max(gap.AfterSeq, gap.BeforeSeq)
	read := func(seq uint64) error {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			deleted = deleted || (seq > lo && seq < hi)
			return nil
		}
		if err != nil {
			return fmt.Errorf("stream %s: message %d: %w", r.cfg.Stream, seq, err)
		}
		if pos := bus.Position(m.Header); pos >= gap.From && pos <= to && !found[pos] {
			found[pos] = true
			out = append(out, delivery(m.Data, pos, seq))
		}
		return nil
	}
	all := func() bool { return uint64(len(found)) > to-gap.From }
	for seq := gap.AfterSeq + 1; seq <= min(info.State.LastSeq, gap.BeforeSeq+refillScan) && !all(); seq++ {
		if err := read(seq); err != nil {
			return nil, false, err
		}
	}
	for seq := gap.AfterSeq; seq+refillScan > lo && seq > 0 && !all(); seq-- {
		if err := read(seq); err != nil {
			return nil, false, err
		}
	}
	slices.SortFunc(out, byPosition)
	return out, deleted, nil
}
