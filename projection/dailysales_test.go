package projection_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// saleEvent is event v of stream id with payload d, occurred at at and
// recorded an hour later.
func saleEvent(id string, v int64, d domain.EventData, at time.Time) domain.Event {
	return domain.Event{ID: id + "-e", StreamID: id, StreamType: domain.StreamTypeOrder, Type: d.EventType(), Version: v,
		OccurredAt: at, RecordedAt: at.Add(time.Hour), Data: d}
}

// Given an order's events, the daily_sales document is its Sale: the UTC
// day of the placement (not of later events, not the local date), the
// placement's amounts, the current status, the version and the newest
// event's RecordedAt.
func TestDailySalesFold(t *testing.T) {
	// 23:30 in São Paulo is the next day in UTC.
	placedAt := time.Date(2017, 10, 1, 23, 30, 0, 0, time.FixedZone("BRT", -3*3600))
	placed := domain.OrderPlaced{CustomerID: "c-1", Currency: "BRL", FreightCents: 500, Items: []domain.Line{
		{SKU: "a", Quantity: 2, UnitPriceCents: 1000, FreightCents: 150},
		{SKU: "b", Quantity: 1, UnitPriceCents: 250},
	}}
	later := placedAt.Add(72 * time.Hour)
	base := projection.Sale{OrderID: "o-1", Day: "2017-10-02", Currency: "BRL", ItemCount: 3, SubtotalCents: 2250, FreightCents: 650}
	for _, tc := range []struct {
		name string
		then []domain.EventData
		want projection.Sale
	}{
		{"placed", nil, with(base, domain.StatusCreated, 1, placedAt)},
		{"approved and shipped", []domain.EventData{domain.OrderApproved{}, domain.OrderShipped{}}, with(base, domain.StatusShipped, 3, later)},
		{"canceled", []domain.EventData{domain.OrderCanceled{Reason: "r"}}, with(base, domain.StatusCanceled, 2, later)},
		{"unavailable", []domain.EventData{domain.OrderApproved{}, domain.OrderMarkedUnavailable{Reason: "r"}}, with(base, domain.StatusUnavailable, 3, later)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := []domain.Event{saleEvent("o-1", 1, placed, placedAt)}
			for i, d := range tc.then {
				evs = append(evs, saleEvent("o-1", int64(i+2), d, later))
			}
			got, n, err := projection.DailySales.Fold(evs)
			if err != nil || n != len(evs) {
				t.Fatalf("fold: %d of %d events, %v", n, len(evs), err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sale\n got %+v\nwant %+v", got, tc.want)
			}
			if v := projection.DailySales.StreamVersion(&got); v != int64(len(evs)) {
				t.Errorf("version %d, want %d", v, len(evs))
			}
		})
	}
}

// with is s in status st at version v, its newest event occurred at at
// (recorded an hour later, as saleEvent does).
func with(s projection.Sale, st domain.Status, v int64, at time.Time) projection.Sale {
	s.Status, s.Version, s.RecordedAt = st, v, at.Add(time.Hour)
	return s
}

// Events of an order that was never placed, an unknown event type and an
// illegal transition are poison: Apply returns the domain's error and
// leaves the document unchanged.
func TestDailySalesRefuses(t *testing.T) {
	at := time.Date(2017, 10, 2, 10, 0, 0, 0, time.UTC)
	placed := saleEvent("o-1", 1, domain.OrderPlaced{CustomerID: "c", Currency: "EUR", Items: []domain.Line{{SKU: "a", Quantity: 1, UnitPriceCents: 5}}}, at)
	unknown := saleEvent("o-1", 2, domain.OrderApproved{}, at)
	unknown.Type = "OrderTeleported"
	unknown.Data = teleported{}
	for _, tc := range []struct {
		name  string
		given []domain.Event
		event domain.Event
		want  error
	}{
		{"a lifecycle event of an order never placed", nil, saleEvent("o-2", 1, domain.OrderApproved{}, at), domain.ErrInvalidTransition},
		{"a cancel of an order never placed", nil, saleEvent("o-2", 1, domain.OrderCanceled{Reason: "r"}, at), domain.ErrInvalidTransition},
		{"an unknown event type", []domain.Event{placed}, unknown, domain.ErrUnknownEvent},
		{"a delivery of a created order", []domain.Event{placed}, saleEvent("o-1", 2, domain.OrderDelivered{}, at), domain.ErrInvalidTransition},
		{"a second placement", []domain.Event{placed}, saleEvent("o-1", 2, placed.Data, at), domain.ErrInvalidTransition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, err := projection.DailySales.Fold(tc.given)
			if err != nil {
				t.Fatal(err)
			}
			before := s
			if err := projection.DailySales.Apply(&s, tc.event); !errors.Is(err, tc.want) {
				t.Errorf("apply: %v, want %v", err, tc.want)
			}
			if !reflect.DeepEqual(s, before) {
				t.Errorf("a refused event changed the sale: %+v, was %+v", s, before)
			}
		})
	}
}

type teleported struct{}

func (teleported) EventType() string { return "OrderTeleported" }

// SumSales adds sales per day and currency, counts canceled and unavailable
// orders by their current status, keeps their amounts in the gross, takes
// a pre-summed sale as Orders orders and sorts by day then currency.
func TestSumSales(t *testing.T) {
	got := projection.SumSales([]projection.Sale{
		{Day: "2017-10-03", Currency: "BRL", Status: domain.StatusDelivered, ItemCount: 1, SubtotalCents: 100, FreightCents: 10},
		{Day: "2017-10-02", Currency: "USD", Status: domain.StatusCreated, ItemCount: 2, SubtotalCents: 200, FreightCents: 20},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusCanceled, ItemCount: 3, SubtotalCents: 300, FreightCents: 30},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusUnavailable, ItemCount: 4, SubtotalCents: 400, FreightCents: 40, Orders: 2},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusShipped, ItemCount: 5, SubtotalCents: 500, FreightCents: 50},
	})
	want := []domain.DailySales{
		{Day: "2017-10-02", Currency: "BRL", OrdersPlaced: 4, Items: 12, GrossCents: 1200, FreightCents: 120, OrdersCanceled: 1, OrdersUnavailable: 2},
		{Day: "2017-10-02", Currency: "USD", OrdersPlaced: 1, Items: 2, GrossCents: 200, FreightCents: 20},
		{Day: "2017-10-03", Currency: "BRL", OrdersPlaced: 1, Items: 1, GrossCents: 100, FreightCents: 10},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sums\n got %+v\nwant %+v", got, want)
	}
	if got := projection.SumSales(nil); got == nil || len(got) != 0 {
		t.Errorf("sum of nothing: %#v, want an empty slice", got)
	}
}
