package projector

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// slowApplier counts the write rounds of a Runner in flight at once, each
// made to last a while so that every partition's worker has a batch
// waiting meanwhile.
type slowApplier struct {
	applier
	hold time.Duration

	mu                     sync.Mutex
	inFlight, most, rounds int
	events                 int
}

func (s *slowApplier) Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error) {
	s.mu.Lock()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.rounds++
	s.mu.Unlock()
	time.Sleep(s.hold)
	out, failed, err := s.applier.Apply(ctx, events, fresh)
	s.mu.Lock()
	s.inFlight--
	if err == nil {
		s.events += len(events)
	}
	s.mu.Unlock()
	return out, failed, err
}

func (s *slowApplier) counts() (most, rounds, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most, s.rounds, s.events
}

// TestRunnerBoundsWriteRoundsInFlight: a Runner owning 8 partitions, 2
// workers each, with a backlog in every partition, has at most Writers
// write rounds in flight at once, and applies every event.
func TestRunnerBoundsWriteRoundsInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := storetest.Database(t)
	n := storetest.StartNATS(t)
	stream := bus.StreamConfig{Name: storetest.Unique("ORDERS_"), SubjectPrefix: "orders.events", Duplicates: time.Minute, Partitions: 8}
	if err := bus.EnsureStream(ctx, n.JS, stream); err != nil {
		t.Fatal(err)
	}
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	r := NewRunner(mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db)), n.JS, mongodb.NewDeadLetters(db),
		RunnerConfig{Stream: stream.Name, SubjectPrefix: stream.SubjectPrefix, Partitions: stream.Partitions,
			Workers: 2, Writers: 2, Owner: "w1", LeaseTTL: 5 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	slow := &slowApplier{applier: r.store, hold: 30 * time.Millisecond}
	r.store = slow

	const orders = 64
	for i := range orders {
		c := storetest.NewCommit(fmt.Sprintf("bound-%03d", i), 0,
			domain.OrderPlaced{CustomerID: "cust-1", Currency: "BRL", Items: []domain.Line{{SKU: "sku-1", Quantity: 1, UnitPriceCents: 990}}})
		if _, err := es.Append(ctx, c); err != nil {
			t.Fatal(err)
		}
		body, err := domain.MarshalEvent(c.Events[0])
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: stream.Subject(c.StreamID), Data: body, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, c.Events[0].ID)
		if _, err := n.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	for {
		if _, _, applied := slow.counts(); applied >= orders {
			break
		}
		select {
		case <-ctx.Done():
			_, _, applied := slow.counts()
			t.Fatalf("%d of %d events applied: %v", applied, orders, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	most, rounds, _ := slow.counts()
	t.Logf("%d events in %d write rounds, at most %d in flight", orders, rounds, most)
	if most > 2 {
		t.Errorf("%d write rounds in flight at once, want at most Writers (2)", most)
	}
}
