package projector

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/projection"
)

// Lag returns the number of messages the partitions' consumers have not
// acknowledged, summed over every partition.
func (r *Runner) Lag(ctx context.Context) (uint64, error) {
	return r.sumConsumers(ctx, unacked)
}

// PartitionLag returns the number of messages partition p's consumer has
// not acknowledged: pending plus in flight.
func (r *Runner) PartitionLag(ctx context.Context, p int) (uint64, error) {
	info, err := r.consumerInfo(ctx, p)
	if err != nil {
		return 0, err
	}
	return unacked(info), nil
}

// unacked is what a consumer has not acknowledged: pending plus in flight.
func unacked(info *jetstream.ConsumerInfo) uint64 {
	return info.NumPending + uint64(info.NumAckPending)
}

// consumerInfo reads the state of partition p's consumer from JetStream.
func (r *Runner) consumerInfo(ctx context.Context, p int) (*jetstream.ConsumerInfo, error) {
	return r.namedConsumerInfo(ctx, r.ConsumerName(p))
}

func (r *Runner) namedConsumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := r.js.Consumer(ctx, r.cfg.Stream, name)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	return info, nil
}

// VersionLag is Lag of the consumers of version v of the projection's
// definition: those the processes folding v consume, which feed v's
// collections (the active one, or a shadow being built). The lag of the
// version this runner folds is Lag. Errors: JetStream's, wrapped with the
// consumer's name (jetstream.ErrConsumerNotFound when no process of v
// ever ran, or its consumers were retired).
func (r *Runner) VersionLag(ctx context.Context, v int) (uint64, error) {
	if max(v, 1) == max(r.version, 1) {
		return r.Lag(ctx)
	}
	var n uint64
	for p := range r.cfg.Partitions {
		info, err := r.namedConsumerInfo(ctx, fmt.Sprintf("proj_%s_p%02d", projection.VersionKey(r.name, v), p))
		if err != nil {
			return 0, err
		}
		n += unacked(info)
	}
	return n, nil
}

// AckFloor returns how many deliveries the projection's consumers have
// acknowledged, summed over its partitions (each consumer's ack floor in
// its own sequence): its change over time is the rate at which the
// projection applies events, whichever processes apply them.
func (r *Runner) AckFloor(ctx context.Context) (uint64, error) {
	return r.sumConsumers(ctx, func(info *jetstream.ConsumerInfo) uint64 { return info.AckFloor.Consumer })
}

// sumConsumers adds up what of reads from each partition's consumer.
func (r *Runner) sumConsumers(ctx context.Context, of func(*jetstream.ConsumerInfo) uint64) (uint64, error) {
	var n uint64
	for p := range r.cfg.Partitions {
		info, err := r.consumerInfo(ctx, p)
		if err != nil {
			return 0, err
		}
		n += of(info)
	}
	return n, nil
}

// PartitionStatus returns every partition of the projection: its owner
// ("" when free or expired), lease deadline and ownership from the lease
// documents, the events applied and the apply rate its owner reported at
// its last heartbeat, and, with lag, its consumer's lag in messages and
// in seconds (see lagClock; nil when JetStream does not answer).
func (r *Runner) PartitionStatus(ctx context.Context, lag bool) ([]PartitionStatus, error) {
	leases, err := r.leases.List(ctx, r.cfg.Partitions)
	if err != nil {
		return nil, err
	}
	members, err := r.members.Live(ctx)
	if err != nil {
		return nil, err
	}
	reported := map[string]PartitionReport{} // owner/partition
	for _, m := range members {
		for _, st := range m.Partitions {
			reported[fmt.Sprintf("%s/%d", m.Owner, st.Partition)] = st
		}
	}
	now := time.Now()
	var stream jetstream.Stream
	if lag {
		if stream, err = r.js.Stream(ctx, r.cfg.Stream); err != nil {
			lag = false
		}
	}
	out := make([]PartitionStatus, 0, r.cfg.Partitions)
	for p := range r.cfg.Partitions {
		st := PartitionStatus{Partition: p, Consumer: r.ConsumerName(p)}
		if d := leases[p]; d.Held(now) {
			st.Owner, st.LeaseUntil, st.Epoch = d.Holder, d.ExpiresAt, d.Epoch
			if rep, ok := reported[fmt.Sprintf("%s/%d", d.Holder, p)]; ok {
				st.Applied, st.ApplyRate = rep.Applied, rep.Rate
			}
		}
		if lag {
			if info, err := r.consumerInfo(ctx, p); err == nil {
				n := unacked(info)
				st.Lag = &n
				if secs, err := r.clock.seconds(ctx, stream, info, now); err == nil {
					st.LagSeconds = &secs
				}
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// sample samples the lag of the partitions this process owns and the
// number of dead letters parked, into the metrics.
func (r *Runner) sample(ctx context.Context) {
	if r.metrics == nil {
		return
	}
	var total int64
	sctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/4)
	defer cancel()
	var stream jetstream.Stream // looked up once a partition lags
	now := time.Now()
	for p := range r.owned {
		if info, err := r.consumerInfo(sctx, p); err == nil {
			n := unacked(info)
			r.metrics.setPartitionLag(r.name, p, float64(n))
			total += int64(n)
			if n > 0 && stream == nil {
				stream, _ = r.js.Stream(sctx, r.cfg.Stream)
			}
			if n == 0 || stream != nil {
				if secs, err := r.clock.seconds(sctx, stream, info, now); err == nil {
					r.metrics.setPartitionLagSeconds(r.name, p, secs)
				}
			}
		}
	}
	r.metrics.setLag(r.name, float64(total))
	// The dead letters parked now: one count of a small collection.
	if r.dead != nil {
		if n, err := r.dead.Count(ctx, r.name); err == nil {
			r.metrics.setDeadLetters(r.name, float64(n))
		}
	}
}
