package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Member is one process running a version of a projection, as it answers
// a roll call: its instance id and, per partition it has pulled, the pin
// JetStream gave it last and what it applied.
type Member struct {
	Owner      string            `json:"owner"`
	Partitions []PartitionReport `json:"partitions"`
}

// PartitionReport is what a member reports of a partition it has pulled.
type PartitionReport struct {
	Partition int     `json:"partition"`
	Pin       string  `json:"pin,omitempty"` // the pin id of its last message; the partition is this member's while JetStream's pin is the same
	Applied   int64   `json:"applied"`       // events of the partition this process acknowledged as applied since it started
	Rate      float64 `json:"rate"`          // events per second since the previous roll call
}

// rollCallSubject is where the members of a projection version answer
// roll calls; every member answers (no queue group).
func rollCallSubject(key string) string { return "orderd.projectors." + key + ".members" }

// rollCallWait is how long a roll call collects answers: a member on the
// same NATS answers within milliseconds.
const rollCallWait = 250 * time.Millisecond

// join makes this process answer the roll calls of its projection
// version until leave.
func (r *Runner) join() (func(), error) {
	nc := r.js.Conn()
	sub, err := nc.Subscribe(rollCallSubject(r.key), func(m *nats.Msg) {
		body, err := json.Marshal(r.report())
		if err == nil {
			_ = m.Respond(body)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", r.key, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// report is this process's answer to a roll call.
func (r *Runner) report() Member {
	now := time.Now()
	m := Member{Owner: r.cfg.Owner}
	for _, pt := range r.parts {
		if pin := pt.lastPin(); pin != "" {
			applied, rate := pt.rate(now)
			m.Partitions = append(m.Partitions, PartitionReport{Partition: pt.p, Pin: pin, Applied: applied, Rate: rate})
		}
	}
	return m
}

// RollCall returns the processes running version key of a projection,
// as they answered within rollCallWait, sorted by owner. Errors: the
// connection's.
func RollCall(ctx context.Context, nc *nats.Conn, key string) ([]Member, error) {
	inbox := nc.NewInbox()
	answers := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, answers)
	if err != nil {
		return nil, fmt.Errorf("roll call %s: %w", key, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(rollCallSubject(key), inbox, nil); err != nil {
		return nil, fmt.Errorf("roll call %s: %w", key, err)
	}
	var out []Member
	wait := time.NewTimer(rollCallWait)
	defer wait.Stop()
	for {
		select {
		case m := <-answers:
			var mem Member
			if json.Unmarshal(m.Data, &mem) == nil && mem.Owner != "" {
				out = append(out, mem)
			}
		case <-wait.C:
			slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Owner, b.Owner) })
			return out, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// consumers returns, by partition, the state of the projection's
// consumers (their pins among it). Each is asked of its own leader, which
// answers also while the cluster has no meta leader (a listing of the
// stream's consumers needs one). A consumer that does not exist (no
// process created it yet) or does not answer is missing from the map;
// the error is the last one of a consumer that did not answer.
func (r *Runner) consumers(ctx context.Context) (map[int]*jetstream.ConsumerInfo, error) {
	out := map[int]*jetstream.ConsumerInfo{}
	var last error
	for p := range r.cfg.Partitions {
		info, err := r.consumerInfo(ctx, r.ConsumerName(p))
		switch {
		case err == nil:
			out[p] = info
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			last = err
		}
	}
	return out, last
}

// pinned is the state of the pin group of a consumer (info nil: none):
// its PinnedClientID is "" when no client holds the pin.
func pinned(info *jetstream.ConsumerInfo) jetstream.PriorityGroupState {
	if info != nil {
		for _, g := range info.PriorityGroups {
			if g.Group == pinGroup {
				return g
			}
		}
	}
	return jetstream.PriorityGroupState{}
}

// balance shares the partitions with the projection's other members:
// member i of m (sorted by owner) should hold P/m partitions, plus one if
// i < P mod m, so the shares differ by at most one and add up to P (the
// range assignment of Kafka's consumer groups). A member above its share
// stops pulling its highest partitions and has JetStream unpin them, so
// that a member pulling them in its place gets them at once; a member at
// its share pulls only what it holds; a member below it pulls every
// partition, and is given those no one holds (idle ones, a released one,
// or a dead member's once their pins expire). A partition no message has
// reached is pinned to nobody, and counts for nobody. The consumers read
// for it also give the lag of the partitions held (sample).
func (r *Runner) balance(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, r.cfg.PinnedTTL/2)
	defer cancel()
	infos, err := r.consumers(bctx)
	if len(infos) == 0 && err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection partitions not read; kept as they are", "err", err)
		}
		return
	}
	var held []int
	for _, pt := range r.parts {
		if pin := pt.lastPin(); pin != "" && pin == pinned(infos[pt.p]).PinnedClientID {
			held = append(held, pt.p)
		}
	}
	r.sample(bctx, infos, held)
	// The roll call has its own time: slow lag reads or a slow count of
	// the dead letters must not cut it short.
	rctx, rcancel := context.WithTimeout(ctx, r.cfg.PinnedTTL/2)
	defer rcancel()
	members, err := RollCall(rctx, r.js.Conn(), r.key)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection members not counted; partitions kept as they are", "err", err)
		}
		return
	}
	owners := []string{r.cfg.Owner}
	for _, m := range members {
		if m.Owner != r.cfg.Owner {
			owners = append(owners, m.Owner)
		}
	}
	slices.Sort(owners)
	share := r.cfg.Partitions / len(owners)
	if slices.Index(owners, r.cfg.Owner) < r.cfg.Partitions%len(owners) {
		share++
	}
	var released []int
	if len(held) > share {
		held, released = held[:share], held[share:]
	}
	for _, pt := range r.parts {
		switch {
		case slices.Contains(released, pt.p):
			pt.release()
		case slices.Contains(held, pt.p):
			pt.setPulling(true)
		default:
			pt.setPulling(len(held) < share)
		}
	}
	r.metrics.owned.WithLabelValues(r.name).Set(float64(len(held)))
	if len(released) > 0 {
		r.log.Info("projection partitions given back to share them", "partitions", released, "held", len(held),
			"members", len(owners), "share", share)
	}
}

// release stops pulling the partition and, once its worker has given
// back what it held, has JetStream unpin it (see consumePartition).
func (pt *partition) release() {
	pt.mu.Lock()
	pt.unpin = true
	pt.mu.Unlock()
	pt.setPulling(false)
}

// takeUnpin reports whether the partition was released since the last
// call.
func (pt *partition) takeUnpin() bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	u := pt.unpin
	pt.unpin = false
	return u
}

// unpin has JetStream unpin partition p, so that another puller gets it
// at once rather than after PinnedTTL. A consumer that no one holds has
// nothing to unpin.
func (r *Runner) unpin(ctx context.Context, p int) {
	uctx, cancel := context.WithTimeout(ctx, r.cfg.PinnedTTL/4)
	defer cancel()
	st, err := r.js.Stream(uctx, r.cfg.Stream)
	if err == nil {
		err = st.UnpinConsumer(uctx, r.ConsumerName(p), pinGroup)
	}
	var apiErr *jetstream.APIError
	if err != nil && !(errors.As(err, &apiErr) && apiErr.Code == 400) && ctx.Err() == nil {
		r.log.Warn("projection partition not unpinned; it moves when its pin expires", "partition", p, "err", err)
	}
}
