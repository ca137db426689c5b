package domain_test

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
)

// sampleEvents has one event of every type, times already ms-truncated UTC.
func sampleEvents() []domain.Event {
	datas := []domain.EventData{
		placed(), domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderProcessingStarted{}, domain.OrderShipped{},
		domain.OrderDelivered{}, domain.OrderCanceled{Reason: "customer asked: \"no\" <ünïcode>"}, domain.OrderCanceled{},
		domain.OrderMarkedUnavailable{Reason: "out of stock"}, domain.OrderMarkedUnavailable{},
	}
	evs := make([]domain.Event, len(datas))
	for i, d := range datas {
		evs[i] = event(int64(i+1), d)
		evs[i].RecordedAt = evs[i].OccurredAt.Add(1234 * time.Millisecond)
	}
	return evs
}

// wire is the JSON form of a valid OrderApproved event, as a map to edit.
func wire(t *testing.T) map[string]any {
	t.Helper()
	b, err := domain.MarshalEvent(event(2, domain.OrderApproved{}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEventRoundTrip(t *testing.T) {
	for _, e := range sampleEvents() {
		t.Run(e.Type, func(t *testing.T) {
			b, err := domain.MarshalEvent(e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := domain.UnmarshalEvent(b)
			if err != nil {
				t.Fatalf("UnmarshalEvent(%s): %v", b, err)
			}
			if !reflect.DeepEqual(got, e) {
				t.Fatalf("round trip =\n%#v\nwant\n%#v", got, e)
			}
		})
	}
}

func TestMarshalEventWireForm(t *testing.T) {
	b, err := domain.MarshalEvent(event(1, placed()))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	want := []string{"data", "event_id", "metadata", "occurred_at", "recorded_at", "stream_id", "stream_type", "type", "version"}
	if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, want) {
		t.Fatalf("keys = %q, want %q", got, want)
	}
	for k, v := range map[string]string{
		"data": `{"customer_id":"c-1","currency":"BRL","items":[{"sku":"sku-1","quantity":2,"unit_price_cents":1500},` +
			`{"sku":"sku_2","quantity":3,"unit_price_cents":250}],"freight_cents":999}`,
		"metadata":    `{"correlation_id":"corr","causation_id":"cmd","schema_version":1}`,
		"occurred_at": `"2024-03-01T10:00:00Z"`,
		"type":        `"OrderPlaced"`,
		"version":     `1`,
	} {
		if string(m[k]) != v {
			t.Errorf("%s = %s, want %s", k, m[k], v)
		}
	}
}

func TestUnmarshalEventNormalizesTimes(t *testing.T) {
	m := wire(t)
	m["occurred_at"] = "2024-03-01T12:00:00.123456789+02:00"
	m["recorded_at"] = "2024-03-01T10:00:01.9999Z"
	e, err := domain.UnmarshalEvent(mustJSON(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2024, 3, 1, 10, 0, 0, 123_000_000, time.UTC); !reflect.DeepEqual(e.OccurredAt, want) {
		t.Errorf("OccurredAt = %v, want %v", e.OccurredAt, want)
	}
	if want := time.Date(2024, 3, 1, 10, 0, 1, 999_000_000, time.UTC); !reflect.DeepEqual(e.RecordedAt, want) {
		t.Errorf("RecordedAt = %v, want %v", e.RecordedAt, want)
	}
}

func TestUnmarshalEventRejects(t *testing.T) {
	edit := func(f func(m map[string]any)) func(*testing.T) []byte {
		return func(t *testing.T) []byte { m := wire(t); f(m); return mustJSON(t, m) }
	}
	set := func(k string, v any) func(*testing.T) []byte { return edit(func(m map[string]any) { m[k] = v }) }
	meta := func(k string, v any) func(*testing.T) []byte {
		return edit(func(m map[string]any) { m["metadata"].(map[string]any)[k] = v })
	}
	raw := func(suffix string) func(*testing.T) []byte {
		return func(t *testing.T) []byte { return append(mustJSON(t, wire(t)), suffix...) }
	}
	for _, tc := range []struct {
		name  string
		input func(*testing.T) []byte
		err   error
	}{
		{"unknown field", set("tenant", "x"), domain.ErrValidation},
		{"unknown metadata field", meta("user", "x"), domain.ErrValidation},
		{"unknown data field", set("data", map[string]any{"reason": "x"}), domain.ErrValidation},
		{"unknown type", set("type", "OrderRefunded"), domain.ErrUnknownEvent},
		{"empty type", set("type", ""), domain.ErrUnknownEvent},
		{"schema version 0", meta("schema_version", 0), domain.ErrUnknownEvent},
		{"schema version 2", meta("schema_version", 2), domain.ErrUnknownEvent},
		{"no metadata", edit(func(m map[string]any) { delete(m, "metadata") }), domain.ErrUnknownEvent},
		{"version 0", set("version", 0), domain.ErrValidation},
		{"version -1", set("version", -1), domain.ErrValidation},
		{"fractional version", set("version", 1.5), domain.ErrValidation},
		{"empty event id", set("event_id", ""), domain.ErrValidation},
		{"65-byte event id", set("event_id", strings.Repeat("e", 65)), domain.ErrValidation},
		{"empty stream id", set("stream_id", ""), domain.ErrValidation},
		{"stream id with dot", set("stream_id", "o.1"), domain.ErrValidation},
		{"stream id with dollar", set("stream_id", "$o"), domain.ErrValidation},
		{"stream id with space", set("stream_id", "o 1"), domain.ErrValidation},
		{"stream id with wildcard", set("stream_id", "o*"), domain.ErrValidation},
		{"non-ASCII stream id", set("stream_id", "pedido-ñ"), domain.ErrValidation},
		{"65-byte stream id", set("stream_id", strings.Repeat("o", 65)), domain.ErrValidation},
		{"bad time", set("occurred_at", "yesterday"), domain.ErrValidation},
		{"invalid OrderPlaced data", edit(func(m map[string]any) {
			m["type"], m["data"] = domain.TypeOrderPlaced, map[string]any{"customer_id": "c", "currency": "BRL", "items": []any{}}
		}), domain.ErrValidation},
		{"reason too long", edit(func(m map[string]any) {
			m["type"], m["data"] = domain.TypeOrderCanceled, map[string]any{"reason": strings.Repeat("r", 501)}
		}), domain.ErrValidation},
		{"trailing object", raw("{}"), domain.ErrValidation},
		{"trailing garbage", raw(" x"), domain.ErrValidation},
		{"truncated", func(t *testing.T) []byte { b := mustJSON(t, wire(t)); return b[:len(b)-1] }, domain.ErrValidation},
		{"empty", func(*testing.T) []byte { return nil }, domain.ErrValidation},
		{"not an object", func(*testing.T) []byte { return []byte(`[1]`) }, domain.ErrValidation},
		{"oversized", raw(strings.Repeat(" ", 1<<20)), domain.ErrValidation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := domain.UnmarshalEvent(tc.input(t))
			if !errors.Is(err, tc.err) || !reflect.DeepEqual(e, domain.Event{}) {
				t.Fatalf("UnmarshalEvent = %+v, %v; want %v", e, err, tc.err)
			}
		})
	}
}

// The rejections above are about the one edit each makes: the same input
// without it, or within the limits, is accepted.
func TestUnmarshalEventAccepts(t *testing.T) {
	b := mustJSON(t, wire(t))
	for name, in := range map[string][]byte{
		"as marshaled":             b,
		"trailing newline":         append(slices.Clip(b), '\n'),
		"padded to 1 MiB":          append(slices.Clip(b), strings.Repeat(" ", 1<<20-len(b))...),
		"64-byte ids":              []byte(strings.NewReplacer(`"e-2"`, `"`+strings.Repeat("e", 64)+`"`, `"o-1"`, `"`+strings.Repeat("o", 64)+`"`).Replace(string(b))),
		"no data for OrderShipped": []byte(strings.NewReplacer(`"data":{},`, ``, `OrderApproved`, `OrderShipped`).Replace(string(b))),
	} {
		if _, err := domain.UnmarshalEvent(in); err != nil {
			t.Errorf("%s: UnmarshalEvent(%.200s) = %v", name, in, err)
		}
	}
}

// withLineFreight is placed() with freight f on line i.
func withLineFreight(i int, f int64) domain.OrderPlaced {
	p := placed()
	p.Items = lines()
	p.Items[i].FreightCents = f
	return p
}

func TestDecodeData(t *testing.T) {
	good := `{"customer_id":"c-1","currency":"BRL","items":[{"sku":"sku-1","quantity":2,"unit_price_cents":1500},` +
		`{"sku":"sku_2","quantity":3,"unit_price_cents":250}],"freight_cents":999}`
	for _, tc := range []struct {
		name   string
		typ    string
		schema int
		data   string
		want   domain.EventData
		err    error
		fields []string
	}{
		{"OrderPlaced", domain.TypeOrderPlaced, 1, good, placed(), nil, nil},
		{"empty OrderDelivered", domain.TypeOrderDelivered, 1, "", domain.OrderDelivered{}, nil, nil},
		{"OrderCanceled", domain.TypeOrderCanceled, 1, `{"reason":"r"}`, domain.OrderCanceled{Reason: "r"}, nil, nil},
		{"unknown type", "OrderRefunded", 1, `{}`, nil, domain.ErrUnknownEvent, nil},
		{"schema 0", domain.TypeOrderPlaced, 0, good, nil, domain.ErrUnknownEvent, nil},
		{"schema 1 without line freight, as written before schema 2", domain.TypeOrderPlaced, 1, good, placed(), nil, nil},
		{"schema 2 without line freight", domain.TypeOrderPlaced, 2, good, placed(), nil, nil},
		{"schema 2 with line freight", domain.TypeOrderPlaced, 2, strings.Replace(good, `"quantity":3,"unit_price_cents":250}`,
			`"quantity":3,"unit_price_cents":250,"freight_cents":1234}`, 1), withLineFreight(1, 1234), nil, nil},
		{"schema 1 with line freight", domain.TypeOrderPlaced, 1, strings.Replace(good, `"quantity":3,"unit_price_cents":250}`,
			`"quantity":3,"unit_price_cents":250,"freight_cents":1234}`, 1), nil, domain.ErrValidation, nil},
		{"schema 1 with line freight in upper case", domain.TypeOrderPlaced, 1, strings.Replace(good, `"quantity":3,"unit_price_cents":250}`,
			`"quantity":3,"unit_price_cents":250,"Freight_Cents":1234}`, 1), nil, domain.ErrValidation, nil},
		{"negative line freight", domain.TypeOrderPlaced, 2, strings.Replace(good, `"quantity":2,"unit_price_cents":1500}`,
			`"quantity":2,"unit_price_cents":1500,"freight_cents":-1}`, 1), nil, domain.ErrValidation, []string{"items[0].freight_cents"}},
		{"schema 3", domain.TypeOrderPlaced, 3, good, nil, domain.ErrUnknownEvent, nil},
		{"schema 2 of a type still at 1", domain.TypeOrderCanceled, 2, `{"reason":"r"}`, nil, domain.ErrUnknownEvent, nil},
		{"unknown field", domain.TypeOrderPlaced, 1, strings.Replace(good, `{"customer_id"`, `{"coupon":"x","customer_id"`, 1),
			nil, domain.ErrValidation, nil},
		{"wrong type of field", domain.TypeOrderPlaced, 1, strings.Replace(good, `"freight_cents":999`, `"freight_cents":"999"`, 1),
			nil, domain.ErrValidation, nil},
		{"float money", domain.TypeOrderPlaced, 1, strings.Replace(good, `"freight_cents":999`, `"freight_cents":9.99`, 1),
			nil, domain.ErrValidation, nil},
		{"trailing data", domain.TypeOrderPlaced, 1, good + `{}`, nil, domain.ErrValidation, nil},
		{"no items", domain.TypeOrderPlaced, 1, `{"customer_id":"c","currency":"BRL","freight_cents":0}`,
			nil, domain.ErrValidation, []string{"items"}},
		{"bad currency", domain.TypeOrderPlaced, 1, strings.Replace(good, `"BRL"`, `"real"`, 1),
			nil, domain.ErrValidation, []string{"currency"}},
		{"bad customer", domain.TypeOrderPlaced, 1, strings.Replace(good, `"c-1"`, `"c.1"`, 1),
			nil, domain.ErrValidation, []string{"customer_id"}},
		{"quantity 0", domain.TypeOrderPlaced, 1, strings.Replace(good, `"quantity":3`, `"quantity":0`, 1),
			nil, domain.ErrValidation, []string{"items[1].quantity"}},
		{"negative freight", domain.TypeOrderPlaced, 1, strings.Replace(good, `999`, `-1`, 1),
			nil, domain.ErrValidation, []string{"freight_cents"}},
		{"overflowing total", domain.TypeOrderPlaced, 1, `{"customer_id":"c","currency":"BRL","freight_cents":0,"items":[` +
			strings.Repeat(`{"sku":"s","quantity":1000000,"unit_price_cents":1000000000000},`, 499) +
			`{"sku":"s","quantity":1000000,"unit_price_cents":1000000000000}]}`, nil, domain.ErrValidation, []string{"items"}},
		{"reason too long", domain.TypeOrderMarkedUnavailable, 1, `{"reason":"` + strings.Repeat("r", 501) + `"}`,
			nil, domain.ErrValidation, []string{"reason"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := domain.DecodeData(tc.typ, tc.schema, []byte(tc.data))
			if tc.err == nil {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("DecodeData = %#v, %v; want %#v", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.err) || got != nil {
				t.Fatalf("DecodeData = %#v, %v; want %v", got, err, tc.err)
			}
			if tc.fields != nil {
				var ve *domain.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("%v is not a *ValidationError", err)
				}
				var fields []string
				for _, f := range ve.Fields {
					fields = append(fields, f.Field)
				}
				if !slices.Equal(fields, tc.fields) {
					t.Fatalf("fields = %q, want %q", fields, tc.fields)
				}
			}
		})
	}
}

func TestEncodeData(t *testing.T) {
	for _, tc := range []struct {
		d    domain.EventData
		want string
	}{
		{domain.OrderApproved{}, `{}`},
		{domain.OrderCanceled{}, `{}`},
		{domain.OrderCanceled{Reason: "r"}, `{"reason":"r"}`},
		{domain.OrderMarkedUnavailable{Reason: "r"}, `{"reason":"r"}`},
		{domain.OrderPlaced{CustomerID: "c", Currency: "EUR", Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 0}}},
			`{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price_cents":0}],"freight_cents":0}`},
		{domain.OrderPlaced{CustomerID: "c", Currency: "EUR", Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 0, FreightCents: 7}}},
			`{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price_cents":0,"freight_cents":7}],"freight_cents":0}`},
	} {
		if got, err := domain.EncodeData(tc.d); err != nil || string(got) != tc.want {
			t.Errorf("EncodeData(%#v) = %s, %v; want %s", tc.d, got, err, tc.want)
		}
	}
}

// TestOrderPlacedSchema1 reads an OrderPlaced as the service wrote it before
// lines had freight (schema 1, the whole freight on the order): it decodes,
// folds to the totals it always had, and encodes back to the same bytes.
func TestOrderPlacedSchema1(t *testing.T) {
	old := `{"event_id":"0b5c6f0e","stream_id":"e481f51c","stream_type":"order","type":"OrderPlaced","version":1,` +
		`"occurred_at":"2017-10-02T10:56:33Z","recorded_at":"2024-06-01T12:00:00.987Z","data":{"customer_id":"9ef432eb",` +
		`"currency":"BRL","items":[{"sku":"87285b34","quantity":2,"unit_price_cents":2999}],"freight_cents":872},` +
		`"metadata":{"correlation_id":"req-1","causation_id":"cmd-1","schema_version":1}}`
	e, err := domain.UnmarshalEvent([]byte(old))
	if err != nil {
		t.Fatalf("UnmarshalEvent: %v", err)
	}
	o, err := domain.Fold([]domain.Event{e})
	if err != nil {
		t.Fatalf("Fold: %v", err)
	}
	if o.SubtotalCents != 2*2999 || o.FreightCents != 872 || o.TotalCents != 2*2999+872 || o.Items[0].FreightCents != 0 {
		t.Errorf("folded subtotal %d, freight %d, total %d, items %+v; want 5998, 872, 6870 and no line freight",
			o.SubtotalCents, o.FreightCents, o.TotalCents, o.Items)
	}
	b, err := domain.MarshalEvent(e)
	if err != nil || string(b) != old {
		t.Errorf("MarshalEvent = %s, %v; want the bytes read", b, err)
	}
}
