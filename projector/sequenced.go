package projector

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// refillChunk bounds how many messages one read of the stream fills a gap
// with; a longer gap is filled a chunk at a time.
const refillChunk = 1024

// handleSequenced applies one batch of a Sequenced projection's messages
// in stream order. A gap its Apply names (deliveries a process that held
// the consumer before had received, or a collection behind the others) is
// read from the stream, a chunk at a time, and applied with the batch;
// positions the stream no longer holds are lost (Sequenced.Lost). Every
// message is then acknowledged, but for the whole batch's redelivery
// after a failure that may pass, and but for the deliveries that cannot
// be counted, which are parked.
func (r *Runner) handleSequenced(ctx context.Context, pt *partition, msgs []jetstream.Msg) {
	ds := make([]projection.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = delivery(m.Data(), bus.Position(m.Headers()), 0)
		if md, err := m.Metadata(); err == nil {
			ds[i].Seq = md.Sequence.Stream
		}
	}
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(ds[a].Seq) - int(ds[b].Seq) })
	run := make([]projection.Delivery, len(ds))
	for k, i := range order {
		run[k] = ds[i]
	}
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
		filled, ferr := r.readStream(wctx, gap.AfterSeq, gap.BeforeSeq)
		if ferr != nil {
			err = ferr
			break
		}
		if len(filled) == 0 || filled[0].Position != gap.From {
			r.setLastError(gap)
			r.log.Error("rollup log positions lost: neither delivered nor in the stream; a build from the log repairs it",
				"collection", gap.Collection, "from", gap.From, "to", gap.To, "after_seq", gap.AfterSeq, "before_seq", gap.BeforeSeq)
			if lerr := r.seq.Lost(wctx, gap); lerr != nil {
				err = lerr
				break
			}
			continue // the collection is set aside; the others go on
		}
		run = mergeBySeq(filled, run)
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
		if i >= 0 && !r.park(ctx, msgs[i], d.Event.StreamID, cause) {
			r.redeliver(ctx, msgs, nil)
			return
		}
	}
	for _, m := range msgs {
		_ = m.Ack()
	}
}

// delivery decodes a message of the stream.
func delivery(data []byte, position, seq uint64) projection.Delivery {
	e, err := domain.UnmarshalEvent(data)
	return projection.Delivery{Event: e, Err: err, Position: position, Seq: seq}
}

// mergeBySeq merges two runs sorted by stream sequence, keeping one of
// each sequence.
func mergeBySeq(a, b []projection.Delivery) []projection.Delivery {
	out := slices.Concat(a, b)
	slices.SortStableFunc(out, func(x, y projection.Delivery) int {
		switch {
		case x.Seq < y.Seq:
			return -1
		case x.Seq > y.Seq:
			return 1
		}
		return 0
	})
	return slices.CompactFunc(out, func(x, y projection.Delivery) bool { return x.Seq == y.Seq })
}

// readStream reads the messages with a log position at stream sequences
// after after and before before, at most refillChunk of them, passing
// over those without one (replays) and those the stream no longer holds.
// Errors: JetStream's, but for a message not found.
func (r *Runner) readStream(ctx context.Context, after, before uint64) ([]projection.Delivery, error) {
	st, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", r.cfg.Stream, err)
	}
	var out []projection.Delivery
	for seq := after + 1; seq < before && len(out) < refillChunk; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: message %d: %w", r.cfg.Stream, seq, err)
		}
		if pos := bus.Position(m.Header); pos > 0 {
			out = append(out, delivery(m.Data, pos, seq))
		}
	}
	return out, nil
}
