package mongodb_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestReaderDailySales sums the order summaries per purchase day over a
// range of days: both bounds inclusive whatever their time of day, an order placed
// a millisecond before midnight UTC on its own day, orders outside the
// range left out, days without orders absent, the currency filter, and
// the canceled and unavailable counts by the orders' current status.
func TestReaderDailySales(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	es, db := storetest.OpenStore(t)
	day := func(d, h, m, s, ms int) time.Time { return time.Date(2017, 10, d, h, m, s, ms*1e6, time.UTC) }
	placed := func(currency string, qty, price, freight int64) domain.OrderPlaced {
		return domain.OrderPlaced{CustomerID: "c-1", Currency: currency, FreightCents: freight,
			Items: []domain.Line{{SKU: "a", Quantity: qty, UnitPriceCents: price}, {SKU: "b", Quantity: 1, UnitPriceCents: 100, FreightCents: 7}}}
	}
	orders := []struct {
		id   string
		at   time.Time
		life []domain.EventData
	}{
		{"ds-before", day(1, 0, 0, 0, 0).Add(-time.Millisecond), []domain.EventData{placed("BRL", 1, 1000, 0)}},
		{"ds-first", day(1, 0, 0, 0, 0), []domain.EventData{placed("BRL", 2, 1000, 50), domain.OrderApproved{}, domain.OrderShipped{}, domain.OrderDelivered{}}},
		{"ds-late", day(1, 23, 59, 59, 999), []domain.EventData{placed("BRL", 1, 500, 0), domain.OrderCanceled{Reason: "r"}}},
		{"ds-next", day(2, 0, 0, 0, 0), []domain.EventData{placed("BRL", 3, 200, 10)}},
		{"ds-eur", day(2, 12, 0, 0, 0), []domain.EventData{placed("EUR", 1, 900, 0), domain.OrderApproved{}, domain.OrderMarkedUnavailable{Reason: "r"}}},
		{"ds-eur-2", day(2, 13, 0, 0, 0), []domain.EventData{placed("EUR", 4, 100, 25), domain.OrderCanceled{Reason: "r"}}},
		{"ds-fourth", day(4, 23, 0, 0, 0), []domain.EventData{placed("BRL", 1, 300, 0)}},
		{"ds-after", day(5, 0, 0, 0, 0), []domain.EventData{placed("BRL", 1, 300, 0)}},
	}
	var ids []string
	for _, o := range orders {
		projectiontest.AppendStream(t, ctx, es, o.id, o.life, 1, o.at.Add(-time.Hour))
		ids = append(ids, o.id)
	}
	f := projectiontest.LoadFixture(t, ctx, es, ids)
	if _, poison, err := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil).Apply(ctx, f.Flat); err != nil || len(poison) > 0 {
		t.Fatalf("apply: poison %v, err %v", poison, err)
	}
	if err := projectiontest.DiffReadModels(ctx, db, f); err != nil {
		t.Fatal(err)
	}

	// AppendStream puts event v at base + v hours: each placement at o.at.
	brl1 := domain.DailySales{Day: "2017-10-01", Currency: "BRL", OrdersPlaced: 2, Items: 3 + 2, GrossCents: 2000 + 100 + 500 + 100,
		FreightCents: 50 + 7 + 7, OrdersCanceled: 1}
	brl2 := domain.DailySales{Day: "2017-10-02", Currency: "BRL", OrdersPlaced: 1, Items: 4, GrossCents: 600 + 100, FreightCents: 10 + 7}
	eur2 := domain.DailySales{Day: "2017-10-02", Currency: "EUR", OrdersPlaced: 2, Items: 2 + 5, GrossCents: 900 + 100 + 400 + 100,
		FreightCents: 7 + 25 + 7, OrdersCanceled: 1, OrdersUnavailable: 1}
	brl4 := domain.DailySales{Day: "2017-10-04", Currency: "BRL", OrdersPlaced: 1, Items: 2, GrossCents: 400, FreightCents: 7}
	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	for _, tc := range []struct {
		name     string
		from, to time.Time
		currency string
		want     []domain.DailySales
	}{
		{"four days", day(1, 0, 0, 0, 0), day(4, 0, 0, 0, 0), "", []domain.DailySales{brl1, brl2, eur2, brl4}},
		{"bounds' time of day ignored", day(1, 18, 0, 0, 0), day(4, 0, 0, 0, 1), "", []domain.DailySales{brl1, brl2, eur2, brl4}},
		{"one day", day(2, 0, 0, 0, 0), day(2, 0, 0, 0, 0), "", []domain.DailySales{brl2, eur2}},
		{"one currency", day(1, 0, 0, 0, 0), day(4, 0, 0, 0, 0), "EUR", []domain.DailySales{eur2}},
		{"a currency without orders", day(1, 0, 0, 0, 0), day(4, 0, 0, 0, 0), "USD", []domain.DailySales{}},
		{"a day without orders", day(3, 0, 0, 0, 0), day(3, 0, 0, 0, 0), "", []domain.DailySales{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := r.DailySales(ctx, tc.from, tc.to, tc.currency)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("daily sales\n got %s\nwant %s", projectiontest.Dump(got), projectiontest.Dump(tc.want))
			}
		})
	}
}
