package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/orderd/orderd/domain"
)

// Log is the event log as the log browser reads it: the MongoDB adapter's
// *mongodb.EventStore implements it. Every method fails with
// domain.ErrUnavailable when the store cannot be reached.
type Log interface {
	// Browse returns a page of the commits q selects, newest first.
	Browse(ctx context.Context, q domain.LogQuery) (domain.LogPage, error)
	// LogCommit returns commit id, and false when there is none.
	LogCommit(ctx context.Context, id string) (domain.LogCommit, bool, error)
	// Tail calls fn with the commits recorded after the position after
	// (nil: from when it opens), in commit order, up to batch at a time,
	// with next, the position after them; with no commits once open and
	// whenever about a second passes without one. It returns fn's error,
	// ctx's, or domain.ErrHistoryLost (wrapped) when it cannot resume from
	// after.
	Tail(ctx context.Context, after []byte, batch int, fn func(commits []domain.RecordedCommit, next []byte) error) error
}

// TailLog passes fn the commits of the log's one change stream in this
// process (see tail), from when it is open (fn(nil)) until ctx ends.
func (a *Service) TailLog(ctx context.Context, fn func(*domain.LogCommit) error) error {
	s := a.tail.join(a.Log)
	defer a.tail.leave(s)
	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-s.ch:
			if !ok {
				return s.err
			}
			if err := fn(c); err != nil {
				return err
			}
		}
	}
}

// tailBacklog is how many commits a client of the tail may be behind the
// change stream before it is dropped: the stream waits for no client.
const tailBacklog = 256

// errBehind drops a client that fell tailBacklog commits behind.
var errBehind = errors.New("this client fell more than 256 commits behind the log's change stream")

// tail shares one change stream of the log among the clients of
// GET /v1/admin/log/tail: opened when the first joins, closed when the
// last leaves, so an idle console costs the store nothing and a hundred
// open ones one stream.
type tail struct {
	mu     sync.Mutex
	subs   map[*tailSub]struct{}
	open   bool               // the stream is open: a client joining now misses nothing after its join
	cancel context.CancelFunc // stops the stream; nil when none runs
}

// tailSub is one client: nil on ch is "open" or "still alive", a commit
// the next commit; ch is closed, after err is set, when it was dropped.
type tailSub struct {
	ch  chan *domain.LogCommit
	err error
}

func (t *tail) join(log Log) *tailSub {
	s := &tailSub{ch: make(chan *domain.LogCommit, tailBacklog+1)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.subs == nil {
		t.subs = map[*tailSub]struct{}{}
	}
	t.subs[s] = struct{}{}
	if t.open {
		s.ch <- nil
	}
	if t.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		t.cancel = cancel
		go t.run(ctx, log)
	}
	return s
}

func (t *tail) leave(s *tailSub) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.subs, s)
	if len(t.subs) == 0 && t.cancel != nil {
		t.cancel()
		t.cancel, t.open = nil, false
	}
}

// run tails the log from its end until ctx ends or the stream fails;
// a failure drops every client (each connects again).
func (t *tail) run(ctx context.Context, log Log) {
	err := log.Tail(ctx, nil, tailBacklog, func(commits []domain.RecordedCommit, _ []byte) error {
		t.mu.Lock()
		defer t.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err() // left: a newer stream may serve the clients now
		}
		// The first call, with no commits, is the open: each client gets
		// its nil, and every commit from here.
		t.open = true
		for i := range commits {
			c := logCommitOf(commits[i])
			for s := range t.subs {
				t.send(s, &c)
			}
		}
		if len(commits) == 0 {
			for s := range t.subs {
				t.send(s, nil)
			}
		}
		return nil
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	if ctx.Err() != nil {
		return // its clients left; a newer stream may serve those who came since
	}
	for s := range t.subs {
		t.drop(s, fmt.Errorf("the log's change stream: %w", err))
	}
	t.cancel()
	t.cancel, t.open = nil, false
}

// send passes c to s, or drops s if it is too far behind; a keep-alive
// (nil) is skipped when s has something queued anyway. t.mu is held.
func (t *tail) send(s *tailSub, c *domain.LogCommit) {
	if c == nil && len(s.ch) > 0 {
		return
	}
	if len(s.ch) >= tailBacklog {
		t.drop(s, errBehind)
		return
	}
	s.ch <- c
}

func (t *tail) drop(s *tailSub, err error) {
	delete(t.subs, s)
	s.err = err
	close(s.ch)
}

// logCommitOf is how the log browser shows a commit the relay's change
// stream delivered (domain.RecordedCommit) before it is read back.
func logCommitOf(c domain.RecordedCommit) domain.LogCommit {
	out := domain.LogCommit{ID: c.ID, StreamID: c.StreamID, RecordedAt: c.RecordedAt}
	err := c.Err
	for _, m := range c.Events {
		e, derr := domain.UnmarshalEvent(m.Body)
		if derr != nil {
			err = fmt.Errorf("commit %s: %w: %w", c.ID, domain.ErrUnreadableCommit, derr)
			out.Events = nil
			break
		}
		out.Events = append(out.Events, e)
	}
	if err != nil {
		out.Error = err.Error()
	}
	if len(out.Events) > 0 {
		out.StreamType = out.Events[0].StreamType
		out.FirstVersion, out.LastVersion = out.Events[0].Version, out.Events[len(out.Events)-1].Version
	}
	return out
}
