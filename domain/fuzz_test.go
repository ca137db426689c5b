package domain_test

import (
	"encoding/json"
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

		d, _, err := domain.Order{}.Decide(cmd, time.Unix(0, 0))
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
		if _, ok := d.(domain.OrderPlaced); !ok {
			t.Fatalf("Decide(PlaceOrder) = %#v, want an OrderPlaced", d)
		}
		o, err := domain.Fold([]domain.Event{{ID: "e", StreamID: "o", Type: domain.TypeOrderPlaced, Version: 1, Data: d}})
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

// FuzzMarshalEnvelope: MarshalEnvelope gives json.Marshal's bytes, or its
// error, for any envelope and any JSON payload, whether it writes the
// envelope itself or leaves it to json.Marshal.
func FuzzMarshalEnvelope(f *testing.F) {
	f.Add("e-1", "order-1", "OrderPlaced", int64(1), int64(1_700_000_000), "UTC", `{"customer_id":"c-1","items":[{"sku":"s","quantity":2}],"n":null,"t":true}`, "corr", "", 1)
	f.Add("e-2", "o", "OrderCanceled", int64(-3), int64(0), "UTC", `{"reason":"the customer \"asked\" \\ twice"}`, "", "cause", 2)
	// One reason each to leave the envelope to json.Marshal.
	f.Add("e<3>", "o", "T", int64(7), int64(1), "UTC", `{}`, "", "", 1)
	f.Add("e", "o&", "T", int64(7), int64(1), "UTC", `{}`, "ç", "", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "UTC", `{}`, "", "\u2028", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "UTC", `{"reason":"a < b"}`, "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "UTC", `{ "a" : [1, 2] }`, "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "UTC", `"São"`, "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "America/Sao_Paulo", `{}`, "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(1), "UTC", "\"a\u2028b\"", "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(-62_135_596_801), "UTC", `[]`, "", "", 1)
	f.Add("e", "o", "T", int64(7), int64(253_402_300_800), "UTC", `{}`, "", "", 1)
	f.Fuzz(func(t *testing.T, id, stream, typ string, version, seconds int64, zone, data, corr, cause string, schema int) {
		if !json.Valid([]byte(data)) {
			t.Skip()
		}
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Skip()
		}
		at := time.Unix(seconds, 123_456_000).In(loc)
		e := domain.Event{ID: id, StreamID: stream, StreamType: "order", Type: typ, Version: version, OccurredAt: at, RecordedAt: at.Add(time.Hour),
			Metadata: domain.Metadata{CorrelationID: corr, CausationID: cause, SchemaVersion: schema}}
		want, wantErr := domain.MarshalEnvelopeByReflection(e, json.RawMessage(data))
		got, err := domain.MarshalEnvelope(e, json.RawMessage(data))
		if (err != nil) != (wantErr != nil) || string(got) != string(want) {
			t.Fatalf("MarshalEnvelope:\n got %s, %v\nwant %s, %v", got, err, want, wantErr)
		}
	})
}
