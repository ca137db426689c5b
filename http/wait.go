package http

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/orderd/orderd/domain"
)

// summaryWatch lets requests wait for a summary to reach a version without
// each of them reading the store: every waiter of one summary shares one
// poller, which reads the read model with backoff (5 ms doubling to
// 20 ms for the first second, then to 250 ms) while anyone waits and
// wakes the waiters when what it reads changes. A summary is usually
// applied 40 to 100 ms after the command's answer: with 250 ms from the
// start, the poll after it came up to as long again after it, and the
// side-by-side run's visible p99 was 103 to 194 ms in four runs, against
// 87 to 101 ms with the 20 ms bound (docs/benchmarks.md, "Latest run:
// replacements written as rows, two write rounds in flight"). Waits have
// their own limit, apart from the in-flight limit of commands, so that
// waiting readers cannot take the store's connection pool from commands.
type summaryWatch struct {
	reads ReadModels
	slots chan struct{} // one per waiting request

	mu      sync.Mutex
	watched map[string]*watched
}

// watched is one summary and its waiters.
type watched struct {
	waiters int
	stop    context.CancelFunc
	last    read
	changed chan struct{} // closed when last changes
}

// read is one poll's outcome.
type read struct {
	order domain.Order
	err   error // domain.ErrNotFound while the read model has nothing
}

func newSummaryWatch(reads ReadModels, maxWaits int) *summaryWatch {
	return &summaryWatch{reads: reads, slots: make(chan struct{}, maxWaits), watched: map[string]*watched{}}
}

// wait waits until the summary of id satisfies done, the deadline passes
// or ctx ends, and returns the last read (its error is that of the store,
// or domain.ErrNotFound). ok is false when every wait slot is taken.
func (w *summaryWatch) wait(ctx context.Context, id string, deadline time.Time, first read, done func(read) bool) (r read, ok bool) {
	select {
	case w.slots <- struct{}{}:
		defer func() { <-w.slots }()
	default:
		return first, false
	}
	ws := w.join(id, first)
	defer w.leave(id)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		w.mu.Lock()
		r, changed := ws.last, ws.changed
		w.mu.Unlock()
		if done(r) {
			return r, true
		}
		select {
		case <-changed:
		case <-timer.C:
			return r, true
		case <-ctx.Done():
			return read{err: ctx.Err()}, true
		}
	}
}

// join registers a waiter of id, starting its poller for the first one.
func (w *summaryWatch) join(id string, first read) *watched {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := w.watched[id]
	if ws == nil {
		ctx, stop := context.WithCancel(context.Background())
		ws = &watched{stop: stop, last: first, changed: make(chan struct{})}
		w.watched[id] = ws
		go w.poll(ctx, id, ws)
	}
	ws.waiters++
	return ws
}

// leave unregisters a waiter; the last one stops the poller.
func (w *summaryWatch) leave(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := w.watched[id]
	if ws.waiters--; ws.waiters == 0 {
		ws.stop()
		delete(w.watched, id)
	}
}

// poll reads the summary until its waiters are gone, publishing each read
// that differs from the last one.
func (w *summaryWatch) poll(ctx context.Context, id string, ws *watched) {
	pause, began := 5*time.Millisecond, time.Now()
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o, err := w.reads.Summary(ctx, id)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		if o.Version != ws.last.order.Version || outcome(err) != outcome(ws.last.err) {
			ws.last = read{order: o, err: err}
			close(ws.changed)
			ws.changed = make(chan struct{})
		}
		w.mu.Unlock()
		limit := 20 * time.Millisecond
		if time.Since(began) > time.Second {
			limit = 250 * time.Millisecond
		}
		pause = min(2*pause, limit)
		t.Reset(pause)
	}
}

// outcome classes a read's error: found, not found, or failed.
func outcome(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, domain.ErrNotFound):
		return 1
	}
	return 2
}
