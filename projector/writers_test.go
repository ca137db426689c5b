package projector_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// TestRunnerBoundsWriteRoundsInFlight: a Runner holding 8 partitions,
// with a backlog in every partition, has at most Writers
// write rounds in flight at once, writes the partitions' batches in
// shared rounds (fewer rounds than partitions; a round per partition's
// batch took at least 8), and applies every event.
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
	r := projector.NewRunner(mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db)), n.JS, mongodb.NewDeadLetters(db),
		projector.RunnerConfig{Stream: stream.Name, SubjectPrefix: stream.SubjectPrefix, Partitions: stream.Partitions,
			Writers: 2, Owner: "w1"},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	counts := projector.SlowWrites(r, 30*time.Millisecond)

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
		if _, _, applied := counts(); applied >= orders {
			break
		}
		select {
		case <-ctx.Done():
			_, _, applied := counts()
			t.Fatalf("%d of %d events applied: %v", applied, orders, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	most, rounds, _ := counts()
	t.Logf("%d events in %d write rounds, at most %d in flight", orders, rounds, most)
	if most > 2 {
		t.Errorf("%d write rounds in flight at once, want at most Writers (2)", most)
	}
	if rounds >= stream.Partitions {
		t.Errorf("%d write rounds for the backlogs of %d partitions, want them to share rounds", rounds, stream.Partitions)
	}
}
