package projector_test

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// relayLog runs the relay that tails the log of es, with its lease in db,
// to b's stream until the test ends.
func relayLog(t *testing.T, es *mongodb.EventStore, db *mongo.Database, b *projectortest.Bus, log *slog.Logger) {
	t.Helper()
	cfg := outbox.Config{Owner: "relay-1"}
	lease := mongodb.NewLease(db, outbox.RelayLease, cfg.Owner, outbox.DefaultLeaseTTL)
	projectiontest.Go(t, "relay", outbox.NewRelay(es, bus.NewPublisher(b.JS, b.Stream), lease, cfg, log, outbox.NewMetrics(prometheus.NewRegistry())).Run)
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

// gapped is a summaries Runner, with metrics, that parks a message after
// two deliveries, on a log that holds v1 of stream "gapped" and no more:
// v2, once published, is a gap the log cannot fill until fill appends it.
type gapped struct {
	es   *mongodb.EventStore
	reg  *prometheus.Registry
	dead *mongodb.DeadLetters
	r    *projector.Runner
	at   time.Time // when v1 happened
	v2   domain.Event
}

func newGapped(t *testing.T, ctx context.Context, b *projectortest.Bus, db *mongo.Database, es *mongodb.EventStore, cfg projector.RunnerConfig) *gapped {
	t.Helper()
	g := &gapped{es: es, reg: prometheus.NewRegistry(), dead: mongodb.NewDeadLetters(db),
		at: time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC)}
	projectiontest.AppendStream(t, ctx, g.es, "gapped", projectiontest.Lifecycle(0, "cust-g")[:1], 1, g.at)
	g.v2 = projectiontest.NewEvent("gapped", 2, domain.OrderApproved{}, g.at.Add(time.Hour))
	cfg.MaxDeliveries = 2
	p := mongodb.NewProjection(db, projection.OrderSummaries, g.es, projection.NewMetrics(g.reg), mongodb.NewPointers(db))
	g.r = projectortest.Run(t, b, db, p, cfg, projector.NewMetrics(g.reg))
	return g
}

// fill appends v2 to the log: the cause of its dead letter fixed.
func (g *gapped) fill(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := g.es.Append(ctx, domain.Commit{StreamID: "gapped", StreamType: domain.StreamTypeOrder, ExpectedVersion: 1,
		Events: []domain.Event{g.v2}}); err != nil {
		t.Fatal(err)
	}
}

// owners returns how many partitions each owner holds.
func owners(t *testing.T, ctx context.Context, r *projector.Runner) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, p := range r.PartitionStatus(ctx) {
		if p.Owner != "" {
			out[p.Owner]++
		}
	}
	return out
}

// drives numbers the rounds of driveUntilOwners, so that their orders'
// ids differ.
var drives atomic.Int64

// driveUntilOwners places orders named prefix<n>, a few at a time, until
// the partitions are held as want says (a partition is pinned to a
// process once a message reaches it), and returns ids with them added.
func driveUntilOwners(t *testing.T, ctx context.Context, svc *domain.Service, r *projector.Runner, prefix string, ids []string, want map[string]int) []string {
	t.Helper()
	projectiontest.WaitFor(t, 60*time.Second, fmt.Sprintf("partitions held as %v", want), func() error {
		ids = append(ids, writeOrders(t, ctx, svc, fmt.Sprintf("%s%d-", prefix, drives.Add(1)), 0, 4)...)
		if got := owners(t, ctx, r); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("held as %v", got)
		}
		return nil
	})
	return ids
}

// writeOrders runs the lifecycle of orders from..to-1 named prefix<i>.
func writeOrders(t *testing.T, ctx context.Context, svc *domain.Service, prefix string, from, to int) []string {
	t.Helper()
	var ids []string
	for i := from; i < to; i++ {
		id := fmt.Sprintf("%s%03d", prefix, i)
		ids = append(ids, id)
		for _, cmd := range commands(i, fmt.Sprintf("cust-%d", i%3)) {
			if _, err := svc.Execute(ctx, id, cmd, domain.ExecOptions{}); err != nil {
				t.Fatalf("%s %s: %v", domain.CommandName(cmd), id, err)
			}
		}
	}
	return ids
}

// consumerInfos returns the JetStream state of each of r's partition
// consumers, in partition order.
func consumerInfos(t *testing.T, ctx context.Context, b *projectortest.Bus, r *projector.Runner) []*jetstream.ConsumerInfo {
	t.Helper()
	var out []*jetstream.ConsumerInfo
	for p := range r.Partitions() {
		c, err := b.JS.Consumer(ctx, b.Stream.Name, r.ConsumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, info)
	}
	return out
}
