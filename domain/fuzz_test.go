package domain_test

import (
	"errors"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
)

// FuzzUnmarshalEvent: UnmarshalEvent never panics, and whatever it accepts
// survives MarshalEvent and a second UnmarshalEvent unchanged.
func FuzzUnmarshalEvent(f *testing.F) {
	for _, e := range sampleEvents() {
		b, err := domain.MarshalEvent(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(`{"event_id":"e","stream_id":"o","stream_type":"order","type":"OrderShipped","version":9,` +
		`"occurred_at":"2024-03-01T12:00:00.123456789+02:00","recorded_at":"0001-01-01T00:00:00Z","metadata":{"schema_version":1}}`))
	f.Add([]byte(`{"event_id":"e","stream_id":"o","type":"OrderCanceled","version":1,"data":null,"metadata":{"schema_version":1}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := domain.UnmarshalEvent(b)
		if err != nil {
			if !errors.Is(err, domain.ErrValidation) && !errors.Is(err, domain.ErrUnknownEvent) {
				t.Fatalf("UnmarshalEvent error %v wraps neither ErrValidation nor ErrUnknownEvent", err)
			}
			return
		}
		if e.Version < 1 || e.Data == nil || e.Data.EventType() != e.Type ||
			e.Metadata.SchemaVersion < 1 || e.Metadata.SchemaVersion > domain.CurrentSchema(e.Type) {
			t.Fatalf("UnmarshalEvent accepted a bad envelope: %+v", e)
		}
		if !reflect.DeepEqual(e.OccurredAt, domain.Timestamp(e.OccurredAt)) || !reflect.DeepEqual(e.RecordedAt, domain.Timestamp(e.RecordedAt)) {
			t.Fatalf("times not normalized: %v, %v", e.OccurredAt, e.RecordedAt)
		}
		b2, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatalf("MarshalEvent of an accepted event: %v", err)
		}
		e2, err := domain.UnmarshalEvent(b2)
		if err != nil {
			t.Fatalf("UnmarshalEvent(MarshalEvent(e)) = %v for %s", err, b2)
		}
		if !reflect.DeepEqual(e, e2) {
			t.Fatalf("round trip changed the event:\n%#v\n%#v", e, e2)
		}
	})
}

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
)

// FuzzPlaceOrder: deciding a PlaceOrder never panics; an accepted order
// satisfies every documented bound and folds to the total computed here
// without overflow; an order within the bounds and far from overflow is
// accepted. The lines are n copies of two fuzzed lines, alternating; the
// second carries the fuzzed freight too, so freight is both per line and
// per order.
func FuzzPlaceOrder(f *testing.F) {
	f.Add("c-1", "BRL", uint16(2), "sku-1", int64(2), int64(1500), "sku_2", int64(3), int64(250), int64(999))
	f.Add("c", "USD", uint16(500), "s", int64(1_000_000), int64(1_000_000_000_000), "t", int64(1), int64(0), int64(0))
	f.Add("c", "USD", uint16(3), "s", int64(1_000_000), int64(1_000_000_000_000), "t", int64(1_000_000), int64(1_000_000_000_000), int64(1_000_000_000_000))
	f.Add("c.1", "usd", uint16(0), "", int64(0), int64(-1), "a b", int64(-5), int64(math.MaxInt64), int64(-1))
	f.Add("c", "EUR", uint16(501), "s", int64(1), int64(1), "s", int64(1), int64(1), int64(0))
	f.Fuzz(func(t *testing.T, customer, currency string, n uint16, sku1 string, q1, p1 int64, sku2 string, q2, p2, freight int64) {
		items := make([]domain.Line, int(n)%600)
		for i := range items {
			items[i] = domain.Line{SKU: sku1, Quantity: q1, UnitPriceCents: p1}
			if i%2 == 1 {
				items[i] = domain.Line{SKU: sku2, Quantity: q2, UnitPriceCents: p2, FreightCents: freight}
			}
		}
		cmd := domain.PlaceOrder{CustomerID: customer, Currency: currency, Items: items, FreightCents: freight}

		valid := idPattern.MatchString(customer) && currencyPattern.MatchString(currency) &&
			len(items) >= 1 && len(items) <= 500 && freight >= 0 && freight <= 1e12
		total, allFreight, count := big.NewInt(freight), big.NewInt(freight), new(big.Int)
		for _, l := range items {
			valid = valid && idPattern.MatchString(l.SKU) && l.Quantity >= 1 && l.Quantity <= 1e6 &&
				l.UnitPriceCents >= 0 && l.UnitPriceCents <= 1e12
			total.Add(total, new(big.Int).Mul(big.NewInt(l.Quantity), big.NewInt(l.UnitPriceCents)))
			total.Add(total, big.NewInt(l.FreightCents))
			allFreight.Add(allFreight, big.NewInt(l.FreightCents))
			count.Add(count, big.NewInt(l.Quantity))
		}

		datas, _, err := domain.Order{}.Decide(cmd, time.Unix(0, 0))
		if err != nil {
			if !errors.Is(err, domain.ErrValidation) {
				t.Fatalf("Decide error %v is not ErrValidation", err)
			}
			if valid && total.Cmp(big.NewInt(1<<60)) <= 0 {
				t.Fatalf("Decide refused a valid order with total %v: %v", total, err)
			}
			return
		}
		if !valid || !total.IsInt64() {
			t.Fatalf("Decide accepted an invalid order (total %v): %+v", total, cmd)
		}
		if len(datas) != 1 || datas[0].EventType() != domain.TypeOrderPlaced {
			t.Fatalf("Decide(PlaceOrder) = %#v, want one OrderPlaced", datas)
		}
		o, err := domain.Fold([]domain.Event{{ID: "e", StreamID: "o", Type: domain.TypeOrderPlaced, Version: 1, Data: datas[0]}})
		if err != nil {
			t.Fatalf("fold accepted placement: %v", err)
		}
		if o.TotalCents != total.Int64() || o.ItemCount != count.Int64() || o.FreightCents != allFreight.Int64() ||
			o.SubtotalCents != total.Int64()-allFreight.Int64() ||
			o.Status != domain.StatusCreated || !o.SamePlacement(cmd) {
			t.Fatalf("folded %+v, want total %v, count %v", o, total, count)
		}
	})
}
