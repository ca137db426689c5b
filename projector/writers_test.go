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
	rounds := runBacklog(t, 2, 0, 0)
	most := 0
	for _, r := range rounds {
		most = max(most, r.InFlight)
	}
	t.Logf("%d write rounds, at most %d in flight", len(rounds), most)
	if most > 2 {
		t.Errorf("%d write rounds in flight at once, want at most Writers (2)", most)
	}
	if len(rounds) >= 8 {
		t.Errorf("%d write rounds for the backlogs of 8 partitions, want them to share rounds", len(rounds))
	}
}

// TestRunnerSpacesItsWriteRounds: a Runner whose rounds are spaced (as a
// Sequenced projection's are) starts a round no sooner than the spacing
// after the one before, even with a backlog that would start the next as
// soon as one ends (each round here lasts 30 ms and takes at most 4
// messages of a partition, so the 64 take several; the starts are checked
// against half the spacing, for the time from a round's start to its
// write).
func TestRunnerSpacesItsWriteRounds(t *testing.T) {
	const spacing = 150 * time.Millisecond
	rounds := runBacklog(t, 1, spacing, 4)
	if len(rounds) < 2 {
		t.Fatalf("%d write rounds, want at least 2 to space", len(rounds))
	}
	for i := 1; i < len(rounds); i++ {
		if d := rounds[i].At.Sub(rounds[i-1].At); d < spacing/2 {
			t.Errorf("write round %d began %s after the one before, want about %s", i, d, spacing)
		}
	}
}

// runBacklog publishes one event to each of 64 orders spread over 8
// partitions, runs a Runner of the order summaries with writers rounds
// in flight, batches of at most batch messages (0: the default) and its
// rounds spaced by spacing (0: not), each round made to last 30 ms, until
// every event is applied, and returns the rounds.
func runBacklog(t *testing.T, writers int, spacing time.Duration, batch int) []projector.Round {
	t.Helper()
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
			Writers: writers, BatchSize: batch, Owner: "w1"},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	projector.SpaceWrites(r, spacing)
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
		if rounds, applied := counts(); applied >= orders {
			return rounds
		}
		select {
		case <-ctx.Done():
			_, applied := counts()
			t.Fatalf("%d of %d events applied: %v", applied, orders, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
