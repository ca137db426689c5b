package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/projection"
)

// PartitionStatus is one partition of a projection: its consumer, the
// process JetStream delivers it to and since when, and what that process
// reported at the last roll call.
type PartitionStatus struct {
	Partition int       `json:"partition"`
	Consumer  string    `json:"consumer"`
	Owner     string    `json:"owner,omitempty"` // "" when no process holds the pin
	PinnedAt  time.Time `json:"pinned_at,omitzero"`
	// Lag is the messages of the partition not yet acknowledged; null when
	// JetStream could not be asked.
	Lag *uint64 `json:"lag"`
	// LagSeconds is 0 when nothing is pending, else the seconds since the
	// newest event the partition has applied was recorded: a bound on how
	// stale its documents are. Null when JetStream could not be asked.
	LagSeconds *float64 `json:"lag_seconds"`
	Applied    int64    `json:"applied"`    // events the owner applied in the partition since it started
	ApplyRate  float64  `json:"apply_rate"` // events per second the owner applied between the last two roll calls
}

// Lag returns the number of messages the partitions' consumers have not
// acknowledged, summed over every partition.
func (r *Runner) Lag(ctx context.Context) (uint64, error) {
	return r.sumConsumers(ctx, r.key, unacked)
}

// unacked is what a consumer has not acknowledged: pending plus in flight.
func unacked(info *jetstream.ConsumerInfo) uint64 {
	return info.NumPending + uint64(info.NumAckPending)
}

// consumerInfo reads the state of the named consumer from JetStream: one
// request, which looking the consumer up makes.
func (r *Runner) consumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := r.js.Consumer(ctx, r.cfg.Stream, name)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	return c.CachedInfo(), nil
}

// VersionLag is Lag of the consumers of version v of the projection's
// definition: those the processes folding v consume, which feed v's
// collections (the active one, or a shadow being built). Errors:
// JetStream's, wrapped with the consumer's name
// (jetstream.ErrConsumerNotFound when no process of v ever ran, or its
// consumers were retired).
func (r *Runner) VersionLag(ctx context.Context, v int) (uint64, error) {
	return r.sumConsumers(ctx, projection.VersionKey(r.name, v), unacked)
}

// AckFloor returns how many deliveries the projection's consumers have
// acknowledged, summed over its partitions (each consumer's ack floor in
// its own sequence): its change over time is the rate at which the
// projection applies events, whichever processes apply them.
func (r *Runner) AckFloor(ctx context.Context) (uint64, error) {
	return r.sumConsumers(ctx, r.key, func(info *jetstream.ConsumerInfo) uint64 { return info.AckFloor.Consumer })
}

// sumConsumers adds up what of reads from each partition's consumer of
// the version whose key is key. Errors: the first consumer's that does
// not answer.
func (r *Runner) sumConsumers(ctx context.Context, key string, of func(*jetstream.ConsumerInfo) uint64) (uint64, error) {
	var n uint64
	for p := range r.cfg.Partitions {
		info, err := r.consumerInfo(ctx, r.consumerOf(key, p))
		if err != nil {
			return 0, err
		}
		n += of(info)
	}
	return n, nil
}

// PartitionStatus returns every partition of the projection: the member
// holding its pin (from a roll call: "" when none does), since when, what
// that member applied, and its consumer's lag in messages and in seconds
// (see secondsBehind). What JetStream does not answer (a consumer not
// created yet, NATS down) is left out: no owner, a nil lag.
func (r *Runner) PartitionStatus(ctx context.Context) []PartitionStatus {
	infos, _ := r.consumers(ctx)
	members, _ := RollCall(ctx, r.js.Conn(), r.key)
	type held struct {
		owner string
		rep   PartitionReport
	}
	byPin := map[string]held{}
	for _, m := range members {
		for _, rep := range m.Partitions {
			byPin[fmt.Sprintf("%d/%s", rep.Partition, rep.Pin)] = held{m.Owner, rep}
		}
	}
	secs := r.secondsBehind(ctx, infos)
	out := make([]PartitionStatus, 0, r.cfg.Partitions)
	for p := range r.cfg.Partitions {
		st := PartitionStatus{Partition: p, Consumer: r.ConsumerName(p)}
		info := infos[p]
		if g := pinned(info); g.PinnedClientID != "" {
			if m, ok := byPin[fmt.Sprintf("%d/%s", p, g.PinnedClientID)]; ok {
				st.Owner, st.Applied, st.ApplyRate = m.owner, m.rep.Applied, m.rep.Rate
			}
			st.PinnedAt = g.PinnedTS
		}
		if info != nil {
			n := unacked(info)
			st.Lag = &n
			if s, ok := secs[p]; ok {
				st.LagSeconds = &s
			}
		}
		out = append(out, st)
	}
	return out
}

// secondsBehind returns the lag in seconds of each partition of infos: 0
// when its consumer has nothing unacknowledged, else the time since the
// newest event the partition has applied was recorded (its recorded_at),
// read from the message at the consumer's ack floor. That bounds from
// above how stale the partition's documents can be: what it has not
// applied was recorded later. A partition that has applied nothing yet
// (or whose floor message the stream no longer holds) counts from its
// oldest pending event. A partition whose lag could not be read (the
// message cannot be read or carries no recorded_at) is missing.
func (r *Runner) secondsBehind(ctx context.Context, infos map[int]*jetstream.ConsumerInfo) map[int]float64 {
	out := map[int]float64{}
	var stream jetstream.Stream // looked up once a partition lags
	now := time.Now()
	for p, info := range infos {
		if unacked(info) == 0 {
			out[p] = 0
			continue
		}
		var err error
		if stream == nil {
			if stream, err = r.js.Stream(ctx, r.cfg.Stream); err != nil {
				return out
			}
		}
		var msg *jetstream.RawStreamMsg
		seq := info.AckFloor.Stream
		if seq > 0 {
			msg, err = stream.GetMsg(ctx, seq)
		}
		if seq == 0 || err != nil {
			msg, err = stream.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(info.Config.FilterSubject))
		}
		var e struct {
			RecordedAt time.Time `json:"recorded_at"`
		}
		if err == nil && json.Unmarshal(msg.Data, &e) == nil && !e.RecordedAt.IsZero() {
			out[p] = max(now.Sub(e.RecordedAt), 0).Seconds()
		}
	}
	return out
}

// sample records, in the metrics, the lag of the partitions this process
// holds (held, whose consumers infos has) and the number of dead letters
// parked.
func (r *Runner) sample(ctx context.Context, infos map[int]*jetstream.ConsumerInfo, held []int) {
	mine := map[int]*jetstream.ConsumerInfo{}
	for _, p := range held {
		mine[p] = infos[p]
	}
	secs := r.secondsBehind(ctx, mine)
	var total uint64
	for _, pt := range r.parts {
		p := strconv.Itoa(pt.p)
		info, ok := mine[pt.p]
		if !ok {
			// Its new owner exposes its lag; the applied counter stays,
			// as counters do.
			r.metrics.partLag.DeleteLabelValues(r.name, p)
			r.metrics.partLagSecs.DeleteLabelValues(r.name, p)
			continue
		}
		n := unacked(info)
		r.metrics.partLag.WithLabelValues(r.name, p).Set(float64(n))
		total += n
		if s, ok := secs[pt.p]; ok {
			r.metrics.partLagSecs.WithLabelValues(r.name, p).Set(s)
		}
	}
	r.metrics.lag.WithLabelValues(r.name).Set(float64(total))
	// The dead letters parked now: one count of a small collection.
	if r.dead != nil {
		if n, err := r.dead.Count(ctx, r.name); err == nil {
			r.metrics.parked.WithLabelValues(r.name).Set(float64(n))
		}
	}
}
