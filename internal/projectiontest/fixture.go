package projectiontest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// Lifecycle returns the payloads of order i's life: one of seven paths
// through the lifecycle table, from a placed-only order to a full
// delivery, with the canceled and unavailable ends.
func Lifecycle(i int, customerID string) []domain.EventData {
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

// NewEvent is the event of stream id at version v with payload d.
func NewEvent(id string, v int64, d domain.EventData, at time.Time) domain.Event {
	return domain.Event{
		ID: fmt.Sprintf("%s-e%d", id, v), StreamID: id, StreamType: domain.StreamTypeOrder, Type: d.EventType(),
		Version: v, OccurredAt: domain.Timestamp(at), Data: d,
		Metadata: domain.Metadata{CorrelationID: "corr-" + id, CausationID: fmt.Sprintf("cmd-%s-%d", id, v), SchemaVersion: domain.CurrentSchema(d.EventType())},
	}
}

// AppendStream appends datas to stream id through the event store, perCommit
// events per commit.
func AppendStream(t *testing.T, ctx context.Context, es *mongodb.EventStore, id string, datas []domain.EventData, perCommit int, base time.Time) {
	t.Helper()
	var version int64
	for start := 0; start < len(datas); start += perCommit {
		c := domain.Commit{StreamID: id, StreamType: domain.StreamTypeOrder, ExpectedVersion: version}
		for _, d := range datas[start:min(start+perCommit, len(datas))] {
			version++
			c.Events = append(c.Events, NewEvent(id, version, d, base.Add(time.Duration(version)*time.Hour)))
		}
		if _, err := es.Append(ctx, c); err != nil {
			t.Fatalf("append %s at v%d: %v", id, c.ExpectedVersion, err)
		}
	}
}

// Fixture is a set of order streams in the log, with what the log says
// about them: the events (from the event store's Load) and their fold.
type Fixture struct {
	IDs    []string
	Events map[string][]domain.Event
	Flat   []domain.Event // every event, by stream (IDs order) then version
	Orders map[string]domain.Order
}

// NewFixture appends n orders named prefix000.. for customers cust-0 ..
// cust-(customers-1), one or two events per commit.
func NewFixture(t *testing.T, ctx context.Context, es *mongodb.EventStore, prefix string, n, customers int) *Fixture {
	t.Helper()
	base := time.Date(2024, 3, 1, 9, 30, 15, 123_456_789, time.UTC)
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s%03d", prefix, i)
		AppendStream(t, ctx, es, id, Lifecycle(i, fmt.Sprintf("cust-%d", i%customers)), 1+i%2, base.Add(time.Duration(i)*time.Minute))
		ids = append(ids, id)
	}
	return LoadFixture(t, ctx, es, ids)
}

// LoadFixture reads the streams ids back from the log and folds them.
func LoadFixture(t *testing.T, ctx context.Context, es *mongodb.EventStore, ids []string) *Fixture {
	t.Helper()
	f := &Fixture{IDs: ids, Events: map[string][]domain.Event{}, Orders: map[string]domain.Order{}}
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
		f.Events[id], f.Orders[id] = evs, o
		f.Flat = append(f.Flat, evs...)
	}
	return f
}

// ExpectedStats computes every customer's stats from the folded orders,
// independently of projection.SumStats: orders counted, orders
// per status, per currency the totals of orders that are neither
// canceled nor unavailable, and the newest recorded_at.
func (f *Fixture) ExpectedStats() map[string]domain.CustomerOrderStats {
	out := map[string]domain.CustomerOrderStats{}
	for _, id := range f.IDs {
		o := f.Orders[id]
		s, ok := out[o.CustomerID]
		if !ok {
			s = domain.CustomerOrderStats{CustomerID: o.CustomerID, ByStatus: map[domain.Status]int64{}, LifetimeValueCents: map[string]int64{}}
		}
		s.OrderCount++
		s.ByStatus[o.Status]++
		if o.Status != domain.StatusCanceled && o.Status != domain.StatusUnavailable {
			s.LifetimeValueCents[o.Currency] += o.TotalCents
		}
		if o.RecordedAt.After(s.RecordedAt) {
			s.RecordedAt = o.RecordedAt
		}
		out[o.CustomerID] = s
	}
	return out
}

// ExpectedDailySales computes the daily sales of the folded orders,
// independently of projection.SumSales: per UTC day of placement and
// currency, orders, items, subtotals and freight, and the orders now
// canceled or unavailable; sorted by day then currency. It also returns
// the first and last day.
func (f *Fixture) ExpectedDailySales() (rows []domain.DailySales, first, last string) {
	type key struct{ day, currency string }
	sums := map[key]domain.DailySales{}
	var keys []key
	for _, id := range f.IDs {
		o := f.Orders[id]
		k := key{o.PlacedAt.UTC().Format(time.DateOnly), o.Currency}
		r, ok := sums[k]
		if !ok {
			keys = append(keys, k)
			r = domain.DailySales{Day: k.day, Currency: k.currency}
		}
		r.OrdersPlaced++
		r.Items += o.ItemCount
		r.GrossCents += o.SubtotalCents
		r.FreightCents += o.FreightCents
		if o.Status == domain.StatusCanceled {
			r.OrdersCanceled++
		}
		if o.Status == domain.StatusUnavailable {
			r.OrdersUnavailable++
		}
		sums[k] = r
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].day < keys[j].day || keys[i].day == keys[j].day && keys[i].currency < keys[j].currency
	})
	rows = []domain.DailySales{}
	for _, k := range keys {
		rows = append(rows, sums[k])
	}
	if len(keys) > 0 {
		first, last = keys[0].day, keys[len(keys)-1].day
	}
	return rows, first, last
}

// Contribution is a document of CustomerTotals: one order's share of its
// customer's totals.
type Contribution struct {
	OrderID    string        `json:"order_id"`
	CustomerID string        `json:"customer_id"`
	Status     domain.Status `json:"status"`
	Currency   string        `json:"currency"`
	TotalCents int64         `json:"total_cents"`
	Version    int64         `json:"version"`
	RecordedAt time.Time     `json:"recorded_at,omitzero"`
}

// CustomerTotals is a second projection, defined for the tests alone: the
// runners, rebuilds, verifies, cutovers and dead letters are the same for
// any projection, and the tests show it on one whose document is not the
// order's. It is at version 2, so that its key differs from its name.
var CustomerTotals = projection.Definition[Contribution]{
	Name:       "customer_totals",
	Collection: "customer_totals",
	Version:    2,
	Apply: func(c *Contribution, e domain.Event) error {
		o := domain.Order{ID: c.OrderID, CustomerID: c.CustomerID, Status: c.Status, Currency: c.Currency,
			TotalCents: c.TotalCents, Version: c.Version}
		if err := o.Apply(e); err != nil {
			return err
		}
		*c = contributionOf(o)
		return nil
	},
	StreamVersion: func(c *Contribution) int64 { return c.Version },
	Indexes:       [][]string{{"customer_id"}},
}

// DiffReadModels returns nil when the read models of db equal the fold of
// the log for every stream of f: each summary (Reader.Summary) is the
// folded order, each customer's stats (Reader.CustomerStats) are
// ExpectedStats and the daily sales over f's days (Reader.DailySales: the
// rollup once built, else summed from the summaries) are
// ExpectedDailySales; the log must hold no other order of f's customers
// or placed on f's days. With totals, each CustomerTotals document is the
// folded order's too.
func DiffReadModels(ctx context.Context, db *mongo.Database, f *Fixture, totals ...bool) error {
	ps := mongodb.NewPointers(db)
	sales := projection.NewRollup(projection.DailySales, mongodb.NewRollups(db), nil, nil, ps, nil, 0)
	r := mongodb.NewReader(db, ps, sales)
	var totalsIn string // CustomerTotals' active collection, when checked
	if len(totals) > 0 && totals[0] {
		ptr, err := ps.Get(ctx, CustomerTotals.Name, CustomerTotals.Collection, 0)
		if err != nil || ptr.Active == "" {
			return fmt.Errorf("%s: active collection %q: %v", CustomerTotals.Name, ptr.Active, err)
		}
		totalsIn = ptr.Active
	}
	for _, id := range f.IDs {
		want := f.Orders[id]
		got, err := r.Summary(ctx, id)
		if err != nil {
			return fmt.Errorf("summary %s (want v%d): %w", id, want.Version, err)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("summary %s is not the fold of the log:\n got %s\nwant %s", id, Dump(got), Dump(want))
		}
		if totalsIn == "" {
			continue
		}
		docs, err := mongodb.NewDocuments[Contribution](db).Load(ctx, totalsIn, []string{id})
		c, ok := docs[id]
		if err != nil || !ok {
			return fmt.Errorf("contribution %s (want v%d): found %v, %v", id, want.Version, ok, err)
		}
		if wc := contributionOf(want); c != wc {
			return fmt.Errorf("contribution %s:\n got %+v\nwant %+v", id, c, wc)
		}
	}
	for customer, want := range f.ExpectedStats() {
		got, err := r.CustomerStats(ctx, customer)
		if err != nil {
			return fmt.Errorf("stats of %s: %w", customer, err)
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("stats of %s:\n got %s\nwant %s", customer, Dump(got), Dump(want))
		}
	}
	want, first, last := f.ExpectedDailySales()
	if len(want) == 0 {
		return nil
	}
	from, _ := time.Parse(time.DateOnly, first)
	to, _ := time.Parse(time.DateOnly, last)
	got, _, err := r.DailySales(ctx, from, to, "")
	if err != nil {
		return fmt.Errorf("daily sales %s to %s: %w", first, last, err)
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("daily sales %s to %s:\n got %s\nwant %s", first, last, Dump(got), Dump(want))
	}
	return nil
}

// contributionOf is the CustomerTotals document of the folded order o.
func contributionOf(o domain.Order) Contribution {
	return Contribution{OrderID: o.ID, CustomerID: o.CustomerID, Status: o.Status, Currency: o.Currency,
		TotalCents: o.TotalCents, Version: o.Version, RecordedAt: o.RecordedAt}
}

// Dump is v as JSON, for failure messages.
func Dump(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}
