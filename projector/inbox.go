package projector

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/internal/pause"
)

// inbox holds a worker's pulled messages until it takes them. A goroutine
// moves each message out of the pull iterator as it arrives, so the
// iterator's buffer (a channel of PullMaxMessages) never fills: when it
// is full the NATS client drops what arrives ("slow consumer") and the
// dropped messages come back only after AckWait. It fills while a batch
// is being written or the partition's writes are fenced, and overflows
// when the client pulls again after a reconnect or missed heartbeats
// while the buffer is still full: six times in one run of the three-node
// cluster tests before this inbox.
//
// The server delivers no more than the consumer's MaxAckPending messages
// unacknowledged, but one held past AckWait it delivers again, and the
// goroutine would take the copy too. So while messages wait in the
// inbox, a second goroutine tells the server every keepalive that they
// are in progress (JetStream's +WPI acknowledgement, which restarts
// their AckWait): the inbox stays within MaxAckPending however long the
// worker is held (a fenced partition, a store election), and the
// messages' delivery counts do not grow meanwhile.
type inbox struct {
	mu    sync.Mutex
	msgs  []jetstream.Msg
	err   error         // why the iterator ended; nil while it runs
	ready chan struct{} // signaled when a message is put or the iterator ends
	done  chan struct{} // closed when the pulling goroutine returns
	stop  context.CancelFunc
}

// pullInto starts moving the messages of it into a new inbox until it is
// stopped or drained, or the inbox's rest is called, and marking those
// waiting in it in progress every keepalive. Errors that do not end the
// iterator are logged and pulling goes on after a short pause.
func pullInto(it jetstream.MessagesContext, keepalive time.Duration, log *slog.Logger) *inbox {
	ctx, stop := context.WithCancel(context.Background())
	in := &inbox{ready: make(chan struct{}, 1), done: make(chan struct{}), stop: stop}
	go func() {
		defer close(in.done)
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err == nil {
				// Kept even when the inbox is being stopped: rest gives
				// it back.
				in.mu.Lock()
				in.msgs = append(in.msgs, m)
				in.mu.Unlock()
				signal(in.ready)
				continue
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				in.mu.Lock()
				in.err = jetstream.ErrMsgIteratorClosed
				in.mu.Unlock()
				signal(in.ready)
				return
			}
			log.Warn("projection pull failed", "err", err)
			pause.For(ctx, 100*time.Millisecond)
		}
	}()
	go func() {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			in.mu.Lock()
			waiting := slices.Clone(in.msgs)
			in.mu.Unlock()
			for _, m := range waiting {
				_ = m.InProgress()
			}
		}
	}()
	return in
}

// signal wakes a waiter on c without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// next returns the oldest message, waiting for one until ctx is done
// (ctx's error) or the iterator ends (its error, once no message is left).
func (in *inbox) next(ctx context.Context) (jetstream.Msg, error) {
	for {
		in.mu.Lock()
		if len(in.msgs) > 0 {
			m := in.msgs[0]
			in.msgs[0] = nil
			in.msgs = in.msgs[1:]
			in.mu.Unlock()
			return m, nil
		}
		err := in.err
		in.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-in.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// take appends to batch the messages waiting while fewer than n are in
// it, waiting up to linger each time none is, and returns it.
func (in *inbox) take(batch []jetstream.Msg, n int, linger time.Duration) []jetstream.Msg {
	for len(batch) < n {
		in.mu.Lock()
		k := min(n-len(batch), len(in.msgs))
		batch = append(batch, in.msgs[:k]...)
		clear(in.msgs[:k])
		in.msgs = in.msgs[k:]
		ended := in.err != nil
		in.mu.Unlock()
		if k > 0 {
			continue
		}
		if ended {
			return batch
		}
		t := time.NewTimer(linger)
		select {
		case <-in.ready:
			t.Stop()
		case <-t.C:
			return batch
		}
	}
	return batch
}

// rest stops the pulling goroutine, waits for it and returns every
// message left in the inbox.
func (in *inbox) rest() []jetstream.Msg {
	in.stop()
	<-in.done
	in.mu.Lock()
	defer in.mu.Unlock()
	out := in.msgs
	in.msgs = nil
	return out
}
