package projections_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
	"github.com/orderd/orderd/projections"
)

// testContext is the context of a test body: canceled when the test ends
// or after limit, whichever comes first.
func testContext(t *testing.T, limit time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	return ctx
}

// testLogger writes warnings and errors of the code under test to the
// test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// goRun runs fn in a goroutine with its own context, canceled and waited
// for in cleanup. An error returned before cleanup fails the test at once,
// so polling loops (which check t.Failed) stop early.
func goRun(t *testing.T, name string, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fn(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20s of cancellation", name)
		}
	})
}

// waitFor polls cond every 100ms until it returns nil, failing the test
// with cond's last error after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if t.Failed() {
			t.Fatalf("%s: gave up, the test already failed; last: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newLog returns the event store of db with its indexes.
func newLog(t *testing.T, ctx context.Context, db *mongo.Database, opts ...eventstore.Option) *eventstore.Store {
	t.Helper()
	es := eventstore.New(db, opts...)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatalf("event store indexes: %v", err)
	}
	return es
}

// connect opens a NATS connection of its own to b, as a second process
// would, closed when the test ends.
func (b *bus) connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	return connectTo(t, b.URL)
}

// connectTo opens a NATS connection to url, closed when the test ends.
func connectTo(t *testing.T, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// relayedLog returns the event store of db (with its indexes) whose
// appends a Relay publishes to b's stream, and runs a Sweeper, with a
// short grace, for commits appended through other stores of db; both run
// until the test ends.
func relayedLog(t *testing.T, ctx context.Context, db *mongo.Database, b *bus, log *slog.Logger) *eventstore.Store {
	t.Helper()
	cfg := eventstore.RelayConfig{Stream: b.stream, Owner: "relay-1", SweepInterval: 100 * time.Millisecond,
		SweepGrace: 100 * time.Millisecond}
	relay := eventstore.NewRelay(db, b.JS, cfg, log, nil)
	goRun(t, "relay", relay.Run)
	goRun(t, "relay sweep", eventstore.NewSweeper(db, b.JS, cfg, log, nil).Run)
	return newLog(t, ctx, db, eventstore.WithAppendHook(relay.Appended))
}

// lifecycle returns the payloads of order i's life: one of seven paths
// through the lifecycle table, from a placed-only order to a full
// delivery, with the canceled and unavailable ends.
func lifecycle(i int, customerID string) []domain.EventData {
	placed := domain.OrderPlaced{
		CustomerID: customerID,
		Currency:   []string{"BRL", "EUR"}[i%2],
		Items: []domain.Line{
			{SKU: "sku-a", Quantity: int64(1 + i%3), UnitPriceCents: int64(1000 + 37*i)},
			// Freight on some lines, as in the Olist data, next to the
			// order-level freight of others.
			{SKU: "sku-b", Quantity: 1, UnitPriceCents: 250, FreightCents: int64(90 * (i % 3))},
		},
		FreightCents: int64(100 * (i % 4)),
	}
	var rest []domain.EventData
	switch i % 7 {
	case 0:
		rest = []domain.EventData{domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderProcessingStarted{},
			domain.OrderShipped{}, domain.OrderDelivered{}}
	case 1:
		rest = []domain.EventData{domain.OrderApproved{}, domain.OrderShipped{}, domain.OrderDelivered{}}
	case 2:
		rest = []domain.EventData{domain.OrderCanceled{Reason: "changed mind"}}
	case 3:
		rest = []domain.EventData{domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderMarkedUnavailable{Reason: "out of stock"}}
	case 4:
		rest = []domain.EventData{domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderShipped{},
			domain.OrderCanceled{Reason: "refused at the door"}}
	case 5:
		// placed only
	case 6:
		rest = []domain.EventData{domain.OrderApproved{}, domain.OrderProcessingStarted{}}
	}
	return append([]domain.EventData{placed}, rest...)
}

// commands returns the commands that produce lifecycle(i, customerID).
func commands(i int, customerID string) []domain.Command {
	var out []domain.Command
	for _, d := range lifecycle(i, customerID) {
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

// newEvent is the event of stream id at version v with payload d.
func newEvent(id string, v int64, d domain.EventData, at time.Time) domain.Event {
	return domain.Event{
		ID: fmt.Sprintf("%s-e%d", id, v), StreamID: id, StreamType: domain.StreamTypeOrder, Type: d.EventType(),
		Version: v, OccurredAt: domain.Timestamp(at), Data: d,
		Metadata: domain.Metadata{CorrelationID: "corr-" + id, CausationID: fmt.Sprintf("cmd-%s-%d", id, v), SchemaVersion: domain.CurrentSchema(d.EventType())},
	}
}

// appendStream appends datas to stream id through the event store, perCommit
// events per commit.
func appendStream(t *testing.T, ctx context.Context, es *eventstore.Store, id string, datas []domain.EventData, perCommit int, base time.Time) {
	t.Helper()
	var version int64
	for start := 0; start < len(datas); start += perCommit {
		c := domain.Commit{StreamID: id, StreamType: domain.StreamTypeOrder, ExpectedVersion: version}
		for _, d := range datas[start:min(start+perCommit, len(datas))] {
			version++
			c.Events = append(c.Events, newEvent(id, version, d, base.Add(time.Duration(version)*time.Hour)))
		}
		if _, err := es.Append(ctx, c); err != nil {
			t.Fatalf("append %s at v%d: %v", id, c.ExpectedVersion, err)
		}
	}
}

// fixture is a set of order streams in the log, with what the log says
// about them: the events (from eventstore Load) and their fold.
type fixture struct {
	es     *eventstore.Store
	ids    []string
	events map[string][]domain.Event
	flat   []domain.Event // every event, by stream (ids order) then version
	orders map[string]domain.Order
}

// newFixture appends n orders named prefix000.. for customers cust-0 ..
// cust-(customers-1), one or two events per commit.
func newFixture(t *testing.T, ctx context.Context, es *eventstore.Store, prefix string, n, customers int) *fixture {
	t.Helper()
	base := time.Date(2024, 3, 1, 9, 30, 15, 123_456_789, time.UTC)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		appendStream(t, ctx, es, id, lifecycle(i, fmt.Sprintf("cust-%d", i%customers)), 1+i%2, base.Add(time.Duration(i)*time.Minute))
		ids = append(ids, id)
	}
	return loadFixture(t, ctx, es, ids)
}

// loadFixture reads the streams ids back from the log and folds them.
func loadFixture(t *testing.T, ctx context.Context, es *eventstore.Store, ids []string) *fixture {
	t.Helper()
	f := &fixture{es: es, ids: ids, events: map[string][]domain.Event{}, orders: map[string]domain.Order{}}
	for _, id := range ids {
		evs, err := es.Load(ctx, id, 0)
		if err != nil {
			t.Fatalf("load %s: %v", id, err)
		}
		if len(evs) == 0 {
			t.Fatalf("load %s: no events", id)
		}
		o, err := domain.Fold(evs)
		if err != nil {
			t.Fatalf("fold %s: %v", id, err)
		}
		f.events[id], f.orders[id] = evs, o
		f.flat = append(f.flat, evs...)
	}
	return f
}

// lastEvents is the last event of every stream.
func (f *fixture) lastEvents() []domain.Event {
	var out []domain.Event
	for _, id := range f.ids {
		evs := f.events[id]
		out = append(out, evs[len(evs)-1])
	}
	return out
}

// multiEventStreams counts the streams with more than one event: those
// whose last event alone is a gap.
func (f *fixture) multiEventStreams() int {
	n := 0
	for _, id := range f.ids {
		if len(f.events[id]) > 1 {
			n++
		}
	}
	return n
}

// expectedStats computes every customer's stats from the folded orders,
// independently of projections.SumContributions: orders counted, orders
// per status, and per currency the totals of orders that are neither
// canceled nor unavailable.
func (f *fixture) expectedStats() map[string]domain.CustomerOrderStats {
	out := map[string]domain.CustomerOrderStats{}
	for _, id := range f.ids {
		o := f.orders[id]
		s, ok := out[o.CustomerID]
		if !ok {
			s = domain.CustomerOrderStats{CustomerID: o.CustomerID, ByStatus: map[domain.Status]int64{}, LifetimeValueCents: map[string]int64{}}
		}
		s.OrderCount++
		s.ByStatus[o.Status]++
		if o.Status != domain.StatusCanceled && o.Status != domain.StatusUnavailable {
			s.LifetimeValueCents[o.Currency] += o.TotalCents
		}
		out[o.CustomerID] = s
	}
	return out
}

func contributionOf(o domain.Order) projections.Contribution {
	return projections.Contribution{OrderID: o.ID, CustomerID: o.CustomerID, Status: o.Status, Currency: o.Currency,
		TotalCents: o.TotalCents, Version: o.Version}
}

func dump(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// diffReadModels returns nil when both read models of db equal the fold of
// the log for every stream of f: each summary (Reader.Summary) is the
// folded order, each stored contribution is the folded order's, and each
// customer's stats (Reader.CustomerStats) are the expected ones.
func diffReadModels(ctx context.Context, db *mongo.Database, f *fixture) error {
	ps := projections.NewPointers(db)
	r := projections.NewReader(db, ps)
	stats := projections.NewProjection(db, projections.CustomerOrderStats, nil, nil, ps)
	for _, id := range f.ids {
		want := f.orders[id]
		got, err := r.Summary(ctx, id)
		if err != nil {
			return fmt.Errorf("summary %s (want v%d): %w", id, want.Version, err)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("summary %s is not the fold of the log:\n got %s\nwant %s", id, dump(got), dump(want))
		}
		c, err := stats.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("contribution %s (want v%d): %w", id, want.Version, err)
		}
		if wc := contributionOf(want); c != wc {
			return fmt.Errorf("contribution %s:\n got %+v\nwant %+v", id, c, wc)
		}
	}
	for customer, want := range f.expectedStats() {
		got, err := r.CustomerStats(ctx, customer)
		if err != nil {
			return fmt.Errorf("stats of %s: %w", customer, err)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("stats of %s:\n got %s\nwant %s", customer, dump(got), dump(want))
		}
	}
	return nil
}

func mustGather(t *testing.T, reg *prometheus.Registry) []*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	return mfs
}

// metric reads a projection's counter or gauge from reg (0 when absent).
func metric(t *testing.T, reg *prometheus.Registry, name, projection string) float64 {
	t.Helper()
	for _, mf := range mustGather(t, reg) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projection" && l.GetValue() == projection {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// logMetrics logs every counter and gauge of a projection.
func logMetrics(t *testing.T, reg *prometheus.Registry, projection string) {
	t.Helper()
	var parts []string
	for _, mf := range mustGather(t, reg) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projection" && l.GetValue() == projection {
					v := m.GetGauge().GetValue()
					if c := m.GetCounter(); c != nil {
						v = c.GetValue()
					}
					parts = append(parts, fmt.Sprintf("%s=%v", strings.TrimPrefix(mf.GetName(), "orderd_projection_"), v))
				}
			}
		}
	}
	t.Logf("%s: %s", projection, strings.Join(parts, " "))
}

// bus is an embedded NATS server with the event stream.
type bus struct {
	*storetest.NATS
	stream eventstore.StreamConfig
}

func newBus(t *testing.T, ctx context.Context) *bus {
	t.Helper()
	b := &bus{NATS: storetest.StartNATS(t), stream: eventstore.StreamConfig{
		Name: storetest.Unique("ORDERS_"), SubjectPrefix: "orders.events", Duplicates: time.Minute, Partitions: 4}}
	if err := eventstore.EnsureStream(ctx, b.JS, b.stream); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bus) runnerConfig() projections.RunnerConfig {
	return projections.RunnerConfig{Stream: b.stream.Name, SubjectPrefix: b.stream.SubjectPrefix, Partitions: b.stream.Partitions, Workers: 2, BatchSize: 16}
}

// messages is the number of messages the stream holds.
func (b *bus) messages(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	st, err := b.JS.Stream(ctx, b.stream.Name)
	if err != nil {
		t.Fatalf("stream %s: %v", b.stream.Name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", b.stream.Name, err)
	}
	return info.State.Msgs
}

// publish puts body on the event subject of stream id with the given
// Nats-Msg-Id and returns the ack.
func (b *bus) publish(t *testing.T, ctx context.Context, streamID string, body []byte, msgID string) *jetstream.PubAck {
	t.Helper()
	msg := &nats.Msg{Subject: b.stream.Subject(streamID), Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	ack, err := b.JS.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("publish to %s: %v", msg.Subject, err)
	}
	return ack
}

// publishEvents publishes events in the order given, each with msgID(e)
// as its Nats-Msg-Id, and fails if the stream dropped one as a duplicate.
func (b *bus) publishEvents(t *testing.T, ctx context.Context, events []domain.Event, msgID func(domain.Event) string) {
	t.Helper()
	for _, e := range events {
		body, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		if ack := b.publish(t, ctx, e.StreamID, body, msgID(e)); ack.Duplicate {
			t.Fatalf("publish %s v%d as %q: the stream dropped it as a duplicate", e.StreamID, e.Version, msgID(e))
		}
	}
}

// waitLag waits until every runner's consumer has no message pending or
// unacknowledged.
func waitLag(t *testing.T, ctx context.Context, limit time.Duration, runners ...*projections.Runner) {
	t.Helper()
	waitFor(t, limit, "consumer lag 0", func() error {
		for _, r := range runners {
			n, err := r.Lag(ctx)
			if err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("%s: lag %d", r.Name(), n)
			}
		}
		return nil
	})
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
