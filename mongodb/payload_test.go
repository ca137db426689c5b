package mongodb

import (
	"math"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
)

// payloads are stored payloads of every kind payloadJSON meets: each event
// type's as toBSON stores it, and documents with each value it writes
// itself and each it leaves to the driver.
func payloads(t testing.TB) map[string]bson.Raw {
	out := map[string]bson.Raw{}
	events := []domain.EventData{
		domain.OrderPlaced{CustomerID: "cust-1", Currency: "BRL", FreightCents: 1590, Items: []domain.Line{
			{SKU: "sku-1", Quantity: 2, UnitPriceCents: 4990}, {SKU: "sku_2", Quantity: 1, UnitPriceCents: 1_000_000_000_000}}},
		domain.OrderApproved{}, domain.OrderCanceled{Reason: "the customer asked"},
		domain.OrderCanceled{Reason: "pedido cancelado: \"sem estoque\"\n"},
		domain.OrderMarkedUnavailable{Reason: "São Paulo <stock> & more"},
	}
	for _, d := range events {
		b, err := toBSON(d, domain.CurrentSchema(d.EventType()))
		if err != nil {
			t.Fatal(err)
		}
		out[d.EventType()+" "+string(b)] = b
	}
	docs := map[string]bson.D{
		"empty":   {},
		"scalars": {{Key: "s", Value: "x"}, {Key: "i", Value: int32(-7)}, {Key: "l", Value: int64(math.MinInt64)}, {Key: "t", Value: true}, {Key: "f", Value: false}, {Key: "n", Value: nil}},
		"nested":  {{Key: "d", Value: bson.D{{Key: "a", Value: bson.A{}}, {Key: "b", Value: bson.A{int32(1), "y", bson.D{}, bson.A{nil}}}}}},
		"double":  {{Key: "x", Value: 1.0}, {Key: "y", Value: 2.5}},
		"escapes": {{Key: "tab\there", Value: "x"}},
		"binary":  {{Key: "b", Value: bson.Binary{Data: []byte{1}}}},
		"time":    {{Key: "at", Value: bson.DateTime(1_700_000_000_000)}},
	}
	for name, d := range docs {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

// TestPayloadJSON: payloadJSON gives the bytes bson.MarshalExtJSON gives
// in relaxed form, the wire form's payload until now, for every kind of
// value, those it writes itself and those it leaves to the driver.
func TestPayloadJSON(t *testing.T) {
	for name, doc := range payloads(t) {
		want, err := bson.MarshalExtJSON(doc, false, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := payloadJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
}

// BenchmarkPayloadJSON: a one-line order's payload, by payloadJSON and by
// the driver's writer.
func BenchmarkPayloadJSON(b *testing.B) {
	doc, err := toBSON(domain.OrderPlaced{CustomerID: "cust-bench", Currency: "BRL",
		Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1990}}}, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("payloadJSON", func(b *testing.B) {
		for b.Loop() {
			_, _ = payloadJSON(doc)
		}
	})
	b.Run("MarshalExtJSON", func(b *testing.B) {
		for b.Loop() {
			_, _ = bson.MarshalExtJSON(doc, false, false)
		}
	})
}
