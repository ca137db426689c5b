package projector

import (
	"context"
	"sync"
)

// writeGate lets a partition's workers write while its lease is known to
// be held. The partition's fence closes it LeaseTTL/2 after the last
// renewal that got through, and a later renewal at the same epoch opens it
// again: the ownership is kept, its consumers keep their place, and no
// message waits out AckWait. This is what rides out a replica-set election
// (about 10-12 s with MongoDB's default electionTimeoutMillis of 10 s),
// longer than LeaseTTL/2, in which every member's renewals fail alike and
// no successor can claim either; a partition whose lease did pass to
// another ownership meanwhile has its ownership ended by the renewal that finds
// out (Runner.renewLoop).
type writeGate struct {
	parent context.Context // the ownership's

	mu     sync.Mutex
	ctx    context.Context // done once the gate closes; writes run under it
	cancel context.CancelFunc
	opened chan struct{} // closed when the gate opens again
}

func newWriteGate(parent context.Context) *writeGate {
	g := &writeGate{parent: parent, opened: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(parent)
	close(g.opened)
	return g
}

// wait returns the context writes run under once the gate is open, or
// ctx's error when ctx is done first. The context is done when the gate
// closes or the ownership ends.
func (g *writeGate) wait(ctx context.Context) (context.Context, error) {
	for {
		g.mu.Lock()
		wctx, opened := g.ctx, g.opened
		g.mu.Unlock()
		if wctx.Err() == nil {
			return wctx, nil
		}
		select {
		case <-opened:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// close stops writes: the context of those under way is cancelled.
func (g *writeGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx.Err() == nil {
		g.cancel()
		g.opened = make(chan struct{})
	}
}

// open lets writes start again; it reports whether the gate was closed.
func (g *writeGate) open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx.Err() == nil || g.parent.Err() != nil {
		return false
	}
	g.ctx, g.cancel = context.WithCancel(g.parent)
	close(g.opened)
	return true
}
