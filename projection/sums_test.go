package projection_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

func TestSumSales(t *testing.T) {
	got := projection.SumSales([]projection.SalesGroup{
		{Day: "2017-10-03", Currency: "BRL", Status: domain.StatusDelivered, Orders: 1, ItemCount: 1, SubtotalCents: 100, FreightCents: 10},
		{Day: "2017-10-02", Currency: "USD", Status: domain.StatusCreated, Orders: 1, ItemCount: 2, SubtotalCents: 200, FreightCents: 20},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusCanceled, Orders: 1, ItemCount: 3, SubtotalCents: 300, FreightCents: 30},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusUnavailable, ItemCount: 4, SubtotalCents: 400, FreightCents: 40, Orders: 2},
		{Day: "2017-10-02", Currency: "BRL", Status: domain.StatusShipped, Orders: 1, ItemCount: 5, SubtotalCents: 500, FreightCents: 50},
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

func TestSumStats(t *testing.T) {
	older, newer := time.Date(2017, 10, 2, 0, 0, 0, 0, time.UTC), time.Date(2017, 10, 3, 0, 0, 0, 0, time.UTC)
	got := projection.SumStats("c-1", []projection.StatsGroup{
		{Status: domain.StatusDelivered, Currency: "BRL", Orders: 2, TotalCents: 300, RecordedAt: older},
		{Status: domain.StatusCanceled, Currency: "BRL", Orders: 1, TotalCents: 50, RecordedAt: newer},
		{Status: domain.StatusUnavailable, Currency: "EUR", Orders: 1, TotalCents: 70},
		{Status: domain.StatusShipped, Currency: "EUR", Orders: 1, TotalCents: 20},
	})
	want := domain.CustomerOrderStats{CustomerID: "c-1", OrderCount: 5,
		ByStatus:           map[domain.Status]int64{domain.StatusDelivered: 2, domain.StatusCanceled: 1, domain.StatusUnavailable: 1, domain.StatusShipped: 1},
		LifetimeValueCents: map[string]int64{"BRL": 300, "EUR": 20}, RecordedAt: newer}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stats\n got %+v\nwant %+v", got, want)
	}
}

func TestSaleDayIsTheUTCDate(t *testing.T) {
	at := time.Date(2017, 10, 1, 23, 30, 0, 0, time.FixedZone("BRT", -3*3600))
	if got := projection.SaleDay(at); got != "2017-10-02" {
		t.Errorf("SaleDay(%v) = %s, want 2017-10-02", at, got)
	}
}
