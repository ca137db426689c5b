package projector_test

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection/projectiontest"
	"github.com/orderd/orderd/projector/projectortest"
)

// relayedLog returns the event store of db (with its indexes) whose
// appends a Relay publishes to b's stream, and runs a Sweeper, with a
// short grace, for commits appended through other stores of db; both run
// until the test ends.
func relayedLog(t *testing.T, ctx context.Context, db *mongo.Database, b *projectortest.Bus, log *slog.Logger) *eventstore.Store {
	t.Helper()
	cfg := outbox.Config{Owner: "relay-1", SweepInterval: 100 * time.Millisecond, SweepGrace: 100 * time.Millisecond}
	commits, pub := eventstore.New(db), bus.NewPublisher(b.JS, b.Stream)
	relay := outbox.NewRelay(commits, pub, cfg, log, nil)
	projectiontest.Go(t, "relay", relay.Run)
	lease := eventstore.NewLease(db, outbox.SweepLease, cfg.Owner, outbox.DefaultLeaseTTL)
	projectiontest.Go(t, "relay sweep", outbox.NewSweeper(commits, pub, lease, cfg, log, nil).Run)
	return projectiontest.NewLog(t, ctx, db, eventstore.WithAppendHook(relay.Appended))
}

// commands returns the commands that produce lifecycle(i, customerID).
func commands(i int, customerID string) []domain.Command {
	var out []domain.Command
	for _, d := range projectiontest.Lifecycle(i, customerID) {
		switch d := d.(type) {
		case domain.OrderPlaced:
			out = append(out, domain.PlaceOrder{CustomerID: d.CustomerID, Currency: d.Currency, Items: d.Items, FreightCents: d.FreightCents})
		case domain.OrderApproved:
			out = append(out, domain.Approve{})
		case domain.OrderInvoiced:
			out = append(out, domain.Invoice{})
		case domain.OrderProcessingStarted:
			out = append(out, domain.StartProcessing{})
		case domain.OrderShipped:
			out = append(out, domain.Ship{})
		case domain.OrderDelivered:
			out = append(out, domain.Deliver{})
		case domain.OrderCanceled:
			out = append(out, domain.Cancel{Reason: d.Reason})
		case domain.OrderMarkedUnavailable:
			out = append(out, domain.MarkUnavailable{Reason: d.Reason})
		}
	}
	return out
}

func reversed(evs []domain.Event) []domain.Event {
	out := slices.Clone(evs)
	slices.Reverse(out)
	return out
}

// partitioned reports whether subject is the stored subject of an event of
// stream id: orders.events.<partition>.<id>, as the stream's transform
// maps the published orders.events.<id>.
func partitioned(subject, id string) bool {
	tok := strings.Split(subject, ".")
	if len(tok) != 4 || tok[0] != "orders" || tok[1] != "events" || tok[3] != id {
		return false
	}
	p, err := strconv.Atoi(tok[2])
	return err == nil && p >= 0 && p < 4
}
