package mongodb

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

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

// BenchmarkChangedCommit: one change event of a one-event commit turned
// into what the relay publishes.
func BenchmarkChangedCommit(b *testing.B) {
	ev := changeEvent(b)
	for b.Loop() {
		if c, err := changedCommit(ev); err != nil || c.Err != nil {
			b.Fatal(err, c.Err)
		}
	}
}

// changeEvent is a change event of the insert of a placed order's commit.
func changeEvent(t testing.TB) bson.Raw {
	d, err := newCommitDoc(domain.Commit{StreamID: "order-bench", StreamType: "order", Events: []domain.Event{{
		ID: "e-1", StreamID: "order-bench", Type: domain.TypeOrderPlaced, Version: 1, OccurredAt: time.Now(),
		Data:     domain.OrderPlaced{CustomerID: "cust-bench", Currency: "BRL", Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1990}}},
		Metadata: domain.Metadata{CorrelationID: "corr-1", SchemaVersion: 1},
	}}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := bson.Marshal(bson.D{{Key: "operationType", Value: "insert"}, {Key: "fullDocument", Value: d}})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// reflected is commitDoc without its UnmarshalBSON: what the driver's
// reflection decodes.
type reflected commitDoc

// TestCommitDocDecodesAsTheDriver: commitDoc's UnmarshalBSON gives what
// the driver's reflection gives, or fails where it fails, for a stored
// commit and for the values a store could hold in place of its fields.
func TestCommitDocDecodesAsTheDriver(t *testing.T) {
	at := time.Date(2024, 3, 1, 12, 0, 0, 123_000_000, time.UTC)
	var events []domain.Event
	for i, d := range []domain.EventData{
		domain.OrderPlaced{CustomerID: "cust-1", Currency: "BRL", Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 4990}}},
		domain.OrderApproved{}, domain.OrderCanceled{Reason: "São Paulo <stock> & more"},
	} {
		events = append(events, domain.Event{ID: fmt.Sprint("e-", i), StreamID: "order-1", Type: d.EventType(), Version: int64(i + 3),
			OccurredAt: at, Data: d, Metadata: domain.Metadata{CorrelationID: "corr", CausationID: "cause", SchemaVersion: domain.CurrentSchema(d.EventType())}})
	}
	stored, err := newCommitDoc(domain.Commit{StreamID: "order-1", StreamType: "order", ExpectedVersion: 2, Events: events,
		IdempotencyKey: "key-1", RequestHash: "hash"}, at)
	if err != nil {
		t.Fatal(err)
	}
	// variant is the stored commit with field key (of its first event
	// with "events.0.") set to value, or removed when value is removed.
	removed := new(int)
	variant := func(key string, value any) []byte {
		var doc bson.D
		if b, err := bson.Marshal(stored); err != nil || bson.Unmarshal(b, &doc) != nil {
			t.Fatal(err)
		}
		set := func(d bson.D, key string, value any) bson.D {
			i := slices.IndexFunc(d, func(e bson.E) bool { return e.Key == key })
			switch {
			case value == removed:
				return slices.Delete(d, i, i+1)
			case i < 0:
				return append(d, bson.E{Key: key, Value: value})
			}
			d[i].Value = value
			return d
		}
		if k, ok := strings.CutPrefix(key, "events.0."); ok {
			events := doc[slices.IndexFunc(doc, func(e bson.E) bool { return e.Key == "events" })].Value.(bson.A)
			events[0] = set(events[0].(bson.D), k, value)
		} else {
			doc = set(doc, key, value)
		}
		b, err := bson.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	whole, err := bson.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"stored":              whole,
		"truncated":           whole[:len(whole)-3],
		"length past its end": append(slices.Clone(whole[:4]), whole[8:]...),
		"outbox marker":       variant("published", true),
		"marker time":         variant("published_at", bson.DateTime(1)),
		"int32 version":       variant("first_version", int32(3)),
		"whole double":        variant("last_version", 5.0),
		"fraction":            variant("last_version", 5.5),
		"string version":      variant("first_version", "3"),
		"null type":           variant("stream_type", nil),
		"null time":           variant("recorded_at", nil),
		"null events":         variant("events", nil),
		"no events":           variant("events", removed),
		"events a document":   variant("events", bson.D{}),
		"event a string":      variant("events", bson.A{"e"}),
		"int id":              variant("_id", int32(1)),
		"string time":         variant("recorded_at", "2024-03-01"),
		"event int64 schema":  variant("events.0.schema_version", int64(2)),
		"event double ver":    variant("events.0.version", 3.0),
		"event null data":     variant("events.0.data", nil),
		"event string data":   variant("events.0.data", "{}"),
		"event array data":    variant("events.0.data", bson.A{}),
		"event no data":       variant("events.0.data", removed),
		"event null id":       variant("events.0.event_id", nil),
		"event int type":      variant("events.0.type", int64(1)),
		"event string at":     variant("events.0.occurred_at", "now"),
		"event extra":         variant("events.0.extra", bson.D{{Key: "x", Value: 1.5}}),
	}
	for name, b := range cases {
		var want reflected
		wantErr := bson.Unmarshal(b, &want)
		var got commitDoc
		err := bson.Unmarshal(b, &got)
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%s: error %v, the driver's %v", name, err, wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, commitDoc(want)) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
}
