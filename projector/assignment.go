package projector

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
)

// step heartbeats, and releases or claims partitions to reach this
// member's share.
func (r *Runner) step(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	if err := r.busReachable(ctx); err == nil {
		r.busOK = time.Now()
	} else if ctx.Err() == nil {
		if r.joined && time.Since(r.busOK) <= ttl/2 {
			r.log.Warn("projection bus unreachable; keeping the partitions for now", "err", err)
		} else {
			// An owner that cannot pull would keep its partitions and
			// apply nothing: leave them to a member that can.
			if r.joined {
				r.log.Warn("projection partitions released: the bus is unreachable", "err", err, "partitions", len(r.owned))
				r.leave(ctx, true)
			} else {
				r.log.Warn("projection partitions not claimed: the bus is unreachable", "err", err)
			}
			return
		}
	}

	// Partitions taken by another owner have had their workers
	// cancelled: wait for them. Fenced ones (renewals failing) are kept,
	// their writes held until a renewal gets through.
	for _, p := range r.ownedPartitions() {
		if tn := r.ownership(p); tn.ended() {
			r.log.Warn("projection partition lease lost: stopping its workers", "partition", p, "taken_by_another", tn.taken.Load())
			r.stop(p)
		}
	}

	// Heartbeat, then compare what is held with this member's share.
	if _, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) { return true, r.members.Heartbeat(ctx, r.stats()) }); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection heartbeat failed", "err", err)
		}
		return
	}
	r.joined = true
	var live []Member
	var leases []Lease
	_, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) {
		var err error
		if live, err = r.members.Live(ctx); err != nil {
			return false, err
		}
		leases, err = r.leases.List(ctx, r.cfg.Partitions)
		return err == nil, err
	})
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("projection partitions not read", "err", err)
		}
		return
	}
	var members []string
	for _, m := range live {
		members = append(members, m.Owner)
	}
	if !slices.Contains(members, r.cfg.Owner) {
		members = append(members, r.cfg.Owner)
		slices.Sort(members)
	}
	me := slices.Index(members, r.cfg.Owner)
	share := fairShare(r.cfg.Partitions, len(members), me)

	// Above the share (a member joined): release the highest partitions,
	// each once its workers have stopped. One line per pass, not per
	// partition: a rebalance moves many at once.
	var released []int
	for len(r.owned) > share {
		p := slices.Max(slices.Collect(maps.Keys(r.owned)))
		lease := r.owned[p].lease
		r.stop(p)
		if _, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) { return true, r.release(ctx, lease) }); err != nil {
			r.log.Warn("projection partition release failed; it expires instead", "partition", p, "err", err)
		}
		released = append(released, p)
	}
	if len(released) > 0 {
		slices.Sort(released)
		r.log.Info("projection partitions released to rebalance", "partitions", released, "count", len(released),
			"owned", len(r.owned), "members", len(members), "share", share)
	}
	// Below it (a member left or died): claim free and expired
	// partitions, starting at this member's place in the ring so that
	// claimants rarely race for the same one.
	now := time.Now()
	began := now
	var claimed []int
	defer func() {
		// One line per pass, however it ended: a start claims every
		// partition at once.
		if len(claimed) > 0 {
			slices.Sort(claimed)
			r.log.Info("projection partitions claimed: consuming", "partitions", claimed, "count", len(claimed),
				"owned", len(r.owned), "members", len(members), "share", share)
		}
	}()
	for i := range leases {
		if len(r.owned) >= share || time.Since(began) > ttl/2 || ctx.Err() != nil {
			break
		}
		p := (i + me*len(leases)/len(members)) % len(leases)
		if _, held := r.owned[p]; held {
			continue
		}
		if d := leases[p]; d.ExpiresAt.After(now) && d.Holder != r.cfg.Owner {
			continue
		}
		var lease Lease
		ok, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) {
			var ok bool
			var err error
			lease, ok, err = r.leases.Claim(ctx, p, r.cfg.Owner, ttl)
			return ok, err
		})
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("projection partition claim failed", "partition", p, "err", err)
			}
			return
		}
		if ok {
			r.start(ctx, p, lease)
			claimed = append(claimed, p)
		}
	}
	r.metrics.setOwned(r.name, len(r.owned))
}

// start runs the workers of partition p, just claimed under lease.
func (r *Runner) start(ctx context.Context, p int, lease Lease) {
	claimedAt := lease.AcquiredAt
	// Another owner may have written this partition's documents since
	// this process last did.
	r.store.Purge()
	pctx, cancel := context.WithCancel(ctx)
	tn := &ownership{p: p, lease: lease, ctx: pctx, cancel: cancel, done: make(chan struct{}), ratedAt: claimedAt, gate: newWriteGate(pctx)}
	tn.fence = time.AfterFunc(time.Until(claimedAt.Add(r.cfg.LeaseTTL/2)), func() {
		if pctx.Err() == nil {
			r.log.Warn("projection partition fenced: its lease was not renewed for half its TTL; writes wait for a renewal", "partition", p)
		}
		tn.gate.close()
	})
	r.mu.Lock()
	r.owned[p] = tn
	r.mu.Unlock()
	if r.cfg.OnOwnership != nil {
		r.cfg.OnOwnership(r.name, p, true)
	}
	go func() {
		defer close(tn.done)
		r.consumePartition(pctx, tn)
		// Every worker has returned: nothing more is written.
		if r.cfg.OnOwnership != nil {
			r.cfg.OnOwnership(r.name, p, false)
		}
	}()
}

// stop cancels partition p's workers and waits until they have returned:
// once stop returns, this process writes nothing more for p.
func (r *Runner) stop(p int) {
	tn := r.owned[p]
	if tn == nil {
		return
	}
	tn.fence.Stop()
	tn.cancel()
	<-tn.done
	r.mu.Lock()
	delete(r.owned, p)
	r.mu.Unlock()
	r.metrics.dropPartition(r.name, p)
	r.metrics.setOwned(r.name, len(r.owned))
}

// leave stops every partition's workers and, with release, frees the
// partitions and removes this member, each bounded by two seconds.
func (r *Runner) leave(ctx context.Context, release bool) {
	for _, p := range slices.Sorted(maps.Keys(r.owned)) {
		lease := r.owned[p].lease
		r.stop(p)
		if release {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := r.release(rctx, lease); err != nil {
				r.log.Warn("projection partition release failed; it expires instead", "partition", p, "err", err)
			}
			cancel()
		}
	}
	if r.joined {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := r.members.Leave(rctx); err != nil {
			r.log.Warn("projection member not removed; its heartbeat expires instead", "err", err)
		}
		cancel()
		r.joined = false
	}
}

// ownedPartitions returns the partitions this process holds, sorted.
func (r *Runner) ownedPartitions() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.owned))
}

func (r *Runner) ownership(p int) *ownership {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[p]
}

// renewLoop renews every LeaseTTL/4 the leases of the partitions held,
// in one update, each renewal pushing back its partition's fence. A
// partition whose lease is found in another owner's hands has its workers
// cancelled at once (step then waits for them); one whose renewals keep
// failing has its writes stopped by its fence LeaseTTL/2 after the last
// renewal that got through, before a successor can claim it at LeaseTTL,
// and started again by the first renewal that gets through.
func (r *Runner) renewLoop(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	t := time.NewTicker(ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		held := map[int]*ownership{}
		for p, tn := range r.owned {
			if !tn.ended() {
				held[p] = tn
			}
		}
		r.mu.Unlock()
		if len(held) == 0 {
			continue
		}
		leases := make([]Lease, 0, len(held))
		byName := make(map[string]int, len(held))
		for p, tn := range held {
			leases = append(leases, tn.lease)
			byName[tn.lease.Name] = p
		}
		ok, err := bounded(ctx, ttl/2, func(ctx context.Context) (bool, error) {
			kept, err := r.leases.Renew(ctx, leases, ttl)
			for _, lease := range kept {
				p := byName[lease.Name]
				tn := held[p]
				tn.fence.Stop()
				tn.fence.Reset(time.Until(lease.RenewedAt.Add(ttl / 2)))
				if tn.gate.open() {
					r.log.Info("projection partition lease renewed after its fence: writing again", "partition", p)
				}
				delete(held, p)
			}
			return err == nil, err
		})
		switch {
		case ok:
			for _, tn := range held { // not renewed: another owner's now
				tn.taken.Store(true)
				tn.cancel()
			}
		case ctx.Err() == nil:
			r.log.Warn("projection partition renewal failed", "partitions", len(held), "err", err)
		}
	}
}

// release frees a partition's lease once its workers have stopped; a
// lease that had already passed to another ownership has nothing to free.
func (r *Runner) release(ctx context.Context, lease Lease) error {
	if err := r.leases.Release(ctx, lease); err != nil && !errors.Is(err, domain.ErrLeaseLost) {
		return err
	}
	return nil
}

// ended reports whether the ownership's workers have been told to stop.
func (tn *ownership) ended() bool { return tn.ctx.Err() != nil }

// bounded runs f with a deadline d from now, and lets it finish when ctx
// is cancelled: a lease write cut off mid-flight may still land on the
// server after the release that shutdown sends next, and hold a
// partition or a member place for a whole TTL.
func bounded(ctx context.Context, d time.Duration, f func(context.Context) (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return f(ctx)
}

// busReachable asks the projection's stream for its info, bounded by a
// quarter of the lease: the stream's leader answers it, also while the
// cluster elects its meta leader, which the consumers do not need either.
// Only this process's trouble counts: an error while its connection is
// down, or an answer that it cannot consume (no such stream). A cluster
// electing a leader, or a stream whose leader does not answer while this
// process is connected, is every member's: releasing the partitions would
// hand them to no one better, and stop consumers that work through it.
func (r *Runner) busReachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/4)
	defer cancel()
	err := bus.CheckStream(ctx, r.js, r.cfg.Stream)
	if err == nil || errors.Is(err, bus.ErrElecting) {
		return nil
	}
	if nc := r.js.Conn(); errors.Is(err, domain.ErrUnavailable) && nc != nil && nc.IsConnected() {
		r.log.Warn("projection stream not answering; keeping the partitions", "err", err)
		return nil
	}
	return err
}
