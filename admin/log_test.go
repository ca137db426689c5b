package admin_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
)

// fakeLog is a log whose change stream delivers what the test sends on
// commits; it counts the streams opened and reports each one's end.
type fakeLog struct {
	commits chan domain.RecordedCommit
	mu      sync.Mutex
	opened  int
	ended   chan struct{} // one value per stream that ended
}

func newFakeLog() *fakeLog {
	return &fakeLog{commits: make(chan domain.RecordedCommit), ended: make(chan struct{}, 8)}
}

func (f *fakeLog) Browse(context.Context, domain.LogQuery) (domain.LogPage, error) {
	return domain.LogPage{}, nil
}

func (f *fakeLog) LogCommit(context.Context, string) (domain.LogCommit, bool, error) {
	return domain.LogCommit{}, false, nil
}

func (f *fakeLog) Tail(ctx context.Context, _ []byte, _ int, fn func([]domain.RecordedCommit, []byte) error) error {
	f.mu.Lock()
	f.opened++
	f.mu.Unlock()
	defer func() { f.ended <- struct{}{} }()
	if err := fn(nil, nil); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c := <-f.commits:
			if err := fn([]domain.RecordedCommit{c}, nil); err != nil {
				return err
			}
		}
	}
}

func (f *fakeLog) streams() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened
}

// client follows TailLog and passes on what it gets.
type client struct {
	got    chan *domain.LogCommit
	cancel context.CancelFunc
	done   chan error
}

func follow(s *admin.Service) *client {
	ctx, cancel := context.WithCancel(context.Background())
	c := &client{got: make(chan *domain.LogCommit, 1024), cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- s.TailLog(ctx, func(lc *domain.LogCommit) error { c.got <- lc; return nil }) }()
	return c
}

// next waits for the client's next commit, skipping keep-alives.
func (c *client) next(t *testing.T) *domain.LogCommit {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case lc := <-c.got:
			if lc != nil {
				return lc
			}
		case <-deadline:
			t.Fatal("no commit within 10 s")
		}
	}
}

// open waits for the client's open (the first nil).
func (c *client) open(t *testing.T) {
	t.Helper()
	select {
	case lc := <-c.got:
		if lc != nil {
			t.Fatalf("first a commit %s, want the open", lc.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not open within 10 s")
	}
}

// TestTailLogSharesOneStream: clients of the log's tail share one change
// stream, opened by the first and closed when the last leaves; the next
// client opens another.
func TestTailLogSharesOneStream(t *testing.T) {
	log := newFakeLog()
	s := admin.New(admin.Config{Log: log})
	a := follow(s)
	a.open(t)
	b := follow(s)
	b.open(t)
	body, err := domain.MarshalEvent(domain.Event{ID: "e-1", StreamID: "o-1", StreamType: domain.StreamTypeOrder, Type: domain.TypeOrderApproved, Version: 1,
		OccurredAt: time.Now(), RecordedAt: time.Now(), Data: domain.OrderApproved{}, Metadata: domain.Metadata{SchemaVersion: 1}})
	if err != nil {
		t.Fatal(err)
	}
	commit := domain.RecordedCommit{ID: "o-1:0000000001", StreamID: "o-1", Events: []domain.EventMessage{{ID: "e-1", Body: body}}}
	log.commits <- commit
	for _, c := range []*client{a, b} {
		if got := c.next(t); got.ID != commit.ID || got.FirstVersion != 1 || got.LastVersion != 1 {
			t.Errorf("a client got %+v, want %s v1..v1", got, commit.ID)
		}
	}
	if n := log.streams(); n != 1 {
		t.Errorf("%d streams for two clients, want 1", n)
	}
	a.cancel()
	<-a.done
	select {
	case <-log.ended:
		t.Fatal("the stream ended while a client still follows it")
	default:
	}
	b.cancel()
	<-b.done
	select {
	case <-log.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream still runs 10 s after its last client left")
	}
	c := follow(s)
	c.open(t)
	if n := log.streams(); n != 2 {
		t.Errorf("%d streams after a new client came, want 2", n)
	}
	c.cancel()
}

// TestTailLogDropsSlowClient: a client that does not read falls behind
// and is dropped with an error; the stream does not wait for it.
func TestTailLogDropsSlowClient(t *testing.T) {
	log := newFakeLog()
	s := admin.New(admin.Config{Log: log})
	stuck := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	opened := make(chan struct{})
	go func() {
		done <- s.TailLog(ctx, func(lc *domain.LogCommit) error {
			if lc == nil {
				select {
				case <-opened:
				default:
					close(opened)
				}
				return nil
			}
			<-stuck // reads nothing more, until the test lets it
			return nil
		})
	}()
	<-opened
	fast := follow(s)
	fast.open(t)
	// One commit at a time, each read by the fast client before the
	// next: only the slow one falls behind, however busy the machine.
	for i := range 300 {
		log.commits <- domain.RecordedCommit{ID: "o:" + strings.Repeat("0", 9) + string(rune('0'+i%10)), StreamID: "o"}
		fast.next(t)
	}
	fast.cancel()
	close(stuck) // the slow client reads again, and finds it was dropped
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "behind") {
			t.Errorf("the slow client ended with %v, want it dropped for falling behind", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow client was not dropped")
	}
}
