package domain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// StreamTypeOrder is the stream type of order streams.
const StreamTypeOrder = "order"

// Event types of the order stream.
const (
	TypeOrderPlaced                  = "OrderPlaced"
	TypeOrderApproved                = "OrderApproved"
	TypeOrderInvoiced                = "OrderInvoiced"
	TypeOrderProcessingStarted       = "OrderProcessingStarted"
	TypeOrderShipped                 = "OrderShipped"
	TypeOrderDelivered               = "OrderDelivered"
	TypeOrderCanceled                = "OrderCanceled"
	TypeOrderMarkedUnavailable       = "OrderMarkedUnavailable"
	maxEventJSONBytes                = 1 << 20
	maxReasonLength                  = 500
	maxItemsPerOrder                 = 500
	maxQuantity                      = 1_000_000
	maxCents                   int64 = 1_000_000_000_000 // 10^10 currency units per amount
)

// Metadata travels with every event. CausationID is the id of the command
// that produced the event; CorrelationID ties together everything one
// client request caused. SchemaVersion is the version of Data's shape, per
// event type (CurrentSchema), used by the upcasters in DecodeData.
type Metadata struct {
	CorrelationID string `json:"correlation_id,omitempty"`
	CausationID   string `json:"causation_id,omitempty"`
	SchemaVersion int    `json:"schema_version"`
}

// Event is one immutable, versioned fact of a stream. Version is 1-based and
// contiguous within a stream. OccurredAt is when it happened in the business
// (a command's timestamp); RecordedAt is when the store committed it. Both
// are normalized by Timestamp.
type Event struct {
	ID         string    `json:"event_id"`
	StreamID   string    `json:"stream_id"`
	StreamType string    `json:"stream_type"`
	Type       string    `json:"type"`
	Version    int64     `json:"version"`
	OccurredAt time.Time `json:"occurred_at"`
	RecordedAt time.Time `json:"recorded_at"`
	Data       EventData `json:"-"`
	Metadata   Metadata  `json:"metadata"`
}

// EventData is the typed payload of an event; EventType names it.
type EventData interface{ EventType() string }

// Line is one order line. Amounts are minor units of the order's currency:
// UnitPriceCents per unit, FreightCents for the whole line (all Quantity
// units), as Olist's order_items.freight_value is per item row. Lines of
// OrderPlaced schema 1 have no freight (zero).
type Line struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
	// omitempty: a line without freight encodes exactly as in schema 1.
	FreightCents int64 `json:"freight_cents,omitempty"`
}

// OrderPlaced starts an order stream. Amounts are minor units of Currency
// (ISO 4217). FreightCents is a whole-order charge on top of the lines'
// own freight; the order's freight is the sum of both. Schema 2 added the
// per-line freight.
type OrderPlaced struct {
	CustomerID   string `json:"customer_id"`
	Currency     string `json:"currency"`
	Items        []Line `json:"items"`
	FreightCents int64  `json:"freight_cents"`
}

// OrderApproved: payment approved.
type OrderApproved struct{}

// OrderInvoiced: invoice issued.
type OrderInvoiced struct{}

// OrderProcessingStarted: the seller started preparing the order.
type OrderProcessingStarted struct{}

// OrderShipped: handed over to the carrier.
type OrderShipped struct{}

// OrderDelivered: delivered to the customer.
type OrderDelivered struct{}

// OrderCanceled: canceled, with the reason given.
type OrderCanceled struct {
	Reason string `json:"reason,omitempty"`
}

// OrderMarkedUnavailable: cannot be fulfilled (stock), with the reason given.
type OrderMarkedUnavailable struct {
	Reason string `json:"reason,omitempty"`
}

func (OrderPlaced) EventType() string            { return TypeOrderPlaced }
func (OrderApproved) EventType() string          { return TypeOrderApproved }
func (OrderInvoiced) EventType() string          { return TypeOrderInvoiced }
func (OrderProcessingStarted) EventType() string { return TypeOrderProcessingStarted }
func (OrderShipped) EventType() string           { return TypeOrderShipped }
func (OrderDelivered) EventType() string         { return TypeOrderDelivered }
func (OrderCanceled) EventType() string          { return TypeOrderCanceled }
func (OrderMarkedUnavailable) EventType() string { return TypeOrderMarkedUnavailable }

// EventTypes returns the name of every event type, sorted.
func EventTypes() []string { return slices.Sorted(maps.Keys(transitions)) }

// Upcaster rewrites the JSON payload of one event type from one schema
// version to the next. Append one to the type's list in upcasters when its
// payload changes shape; stored events are never rewritten (invariant 2).
type Upcaster func(data []byte) ([]byte, error)

// upcasters lists each type's upcasters in schema order: the i-th takes a
// payload from schema version i+1 to i+2.
var upcasters = map[string][]Upcaster{
	TypeOrderPlaced: {upcastPlacedV1},
}

// CurrentSchema returns the schema version the service writes for events of
// eventType, one past its last upcaster (1 for a type whose shape never
// changed), and the highest one DecodeData accepts.
func CurrentSchema(eventType string) int { return len(upcasters[eventType]) + 1 }

// upcastPlacedV1 takes OrderPlaced from schema 1 to 2, which added
// items[].freight_cents. A schema 1 line has no freight, and schema 2 reads
// a missing one as zero, so the payload stays as it is and folds to the
// same totals: its freight_cents was and remains the whole order's. A
// schema 1 payload with a line freight was not written by a schema 1
// writer: it is refused (ErrValidation) rather than given a meaning it
// never had.
func upcastPlacedV1(data []byte) ([]byte, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return data, nil // no items: the decoder reports it
	}
	var v1 struct {
		Items []map[string]json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &v1); err != nil {
		return nil, fmt.Errorf("%v: %w", err, ErrValidation)
	}
	for i, l := range v1.Items {
		for k := range l {
			// encoding/json matches field names case-blind: so does this.
			if strings.EqualFold(k, "freight_cents") {
				return nil, fmt.Errorf("items[%d].freight_cents is not in schema 1: %w", i, ErrValidation)
			}
		}
	}
	return data, nil
}

// EncodeData returns the JSON payload of d.
func EncodeData(d EventData) ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", d.EventType(), err)
	}
	return b, nil
}

// CheckSchema returns an error wrapping ErrUnknownEvent when this build
// does not know the event type or its schema version, nil when
// DecodeData can decode (and upcast) a payload of them.
func CheckSchema(eventType string, schemaVersion int) error {
	if _, ok := transitions[eventType]; !ok {
		return fmt.Errorf("decode %q: %w", eventType, ErrUnknownEvent)
	}
	if schemaVersion < 1 || schemaVersion > CurrentSchema(eventType) {
		return fmt.Errorf("decode %s schema v%d: %w", eventType, schemaVersion, ErrUnknownEvent)
	}
	return nil
}

// DecodeData decodes a JSON payload of the given type and schema version,
// upcasting it to the current schema first. It rejects unknown types and
// schema versions (ErrUnknownEvent), unknown fields and invalid values
// (ErrValidation), so a corrupt event never reaches a fold.
func DecodeData(eventType string, schemaVersion int, data []byte) (EventData, error) {
	if err := CheckSchema(eventType, schemaVersion); err != nil {
		return nil, err
	}
	for i, up := range upcasters[eventType][schemaVersion-1:] {
		var err error
		if data, err = up(data); err != nil {
			return nil, fmt.Errorf("upcast %s from schema v%d: %w", eventType, schemaVersion+i, err)
		}
	}
	if len(data) == 0 {
		data = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	p := reflect.New(reflect.TypeOf(transitions[eventType].payload)) // CheckSchema knows the type
	if err := dec.Decode(p.Interface()); err != nil {
		return nil, fmt.Errorf("decode %s: %v: %w", eventType, err, ErrValidation)
	}
	if trailing(data, dec) {
		return nil, fmt.Errorf("decode %s: trailing data: %w", eventType, ErrValidation)
	}
	d := p.Elem().Interface().(EventData)
	if err := validateData(d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", eventType, err)
	}
	return d, nil
}

// validateData checks the values of a payload, one Decide is to append or
// one DecodeData read, and returns a *ValidationError listing what is
// wrong, or nil.
func validateData(d EventData) error {
	var ve ValidationError
	switch v := d.(type) {
	case OrderPlaced:
		validatePlaced(&ve, v)
	case OrderCanceled:
		validateReason(&ve, v.Reason)
	case OrderMarkedUnavailable:
		validateReason(&ve, v.Reason)
	}
	return ve.err()
}

func validateReason(ve *ValidationError, r string) {
	if len(r) > maxReasonLength {
		ve.add("reason", "at most %d bytes", maxReasonLength)
	}
}

// eventJSON is the wire form of an Event (the body of a NATS message):
// Event's fields with the payload's JSON under "data", which comes before
// "metadata" (shadowing Event's, so encoding/json writes it last).
type eventJSON struct {
	Event
	Data     json.RawMessage `json:"data"`
	Metadata Metadata        `json:"metadata"`
}

// MarshalEvent returns the JSON wire form of e: the envelope fields and its
// payload under "data".
func MarshalEvent(e Event) ([]byte, error) {
	data, err := EncodeData(e.Data)
	if err != nil {
		return nil, err
	}
	return MarshalEnvelope(e, data)
}

// MarshalEnvelope returns the JSON wire form of an event whose payload is
// already JSON: e's envelope fields (its Data is not read) and data under
// "data", as MarshalEvent would give it for the payload data decodes to.
// It checks neither: the log's payloads were checked when appended, and
// UnmarshalEvent checks what it reads. data must be JSON: json.Marshal's
// path returns an error for data that is not, the written path does not
// look.
//
// The bytes are json.Marshal's. The envelope is written field by field
// when its strings need no escape, its times are in years 1 to 9999 and
// data is compact and needs no escape either: what the relay publishes
// for every event of the log. Anything else takes json.Marshal. Its reflection
// took 1.5 µs of the 6 µs the relay spent per one-event commit
// (BenchmarkChangedCommit in mongodb, its CPU profile).
func MarshalEnvelope(e Event, data json.RawMessage) ([]byte, error) {
	if b, ok := appendEnvelope(make([]byte, 0, 320+len(data)), e, data); ok {
		return b, nil
	}
	return json.Marshal(eventJSON{Event: e, Data: data, Metadata: e.Metadata})
}

// appendEnvelope appends json.Marshal's bytes of e's eventJSON with data;
// false when a value is not one it writes (see MarshalEnvelope).
func appendEnvelope(b []byte, e Event, data json.RawMessage) ([]byte, bool) {
	if !plainJSON(data) || !ValidTime(e.OccurredAt) || !ValidTime(e.RecordedAt) {
		return nil, false
	}
	ok := true
	field := func(name, s string) {
		b = append(b, name...)
		ok = ok && plainString(s)
		b = append(append(append(b, '"'), s...), '"')
	}
	field(`{"event_id":`, e.ID)
	field(`,"stream_id":`, e.StreamID)
	field(`,"stream_type":`, e.StreamType)
	field(`,"type":`, e.Type)
	b = strconv.AppendInt(append(b, `,"version":`...), e.Version, 10)
	b = append(e.OccurredAt.AppendFormat(append(b, `,"occurred_at":"`...), time.RFC3339Nano), '"')
	b = append(e.RecordedAt.AppendFormat(append(b, `,"recorded_at":"`...), time.RFC3339Nano), '"')
	b = append(append(b, `,"data":`...), data...)
	b = append(b, `,"metadata":{`...)
	if e.Metadata.CorrelationID != "" {
		field(`"correlation_id":`, e.Metadata.CorrelationID)
		b = append(b, ',')
	}
	if e.Metadata.CausationID != "" {
		field(`"causation_id":`, e.Metadata.CausationID)
		b = append(b, ',')
	}
	b = strconv.AppendInt(append(b, `"schema_version":`...), int64(e.Metadata.SchemaVersion), 10)
	return append(b, "}}"...), ok
}

// plainString: s is printable ASCII that json.Marshal writes as it is
// (no quote, backslash, or <, > and & it escapes for HTML).
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainJSON: data, taken to be JSON, is what json.Marshal writes for it as
// it is: not empty, ASCII, no whitespace outside its strings, no <, > or &.
func plainJSON(data []byte) bool {
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c >= 0x80 || c == '<' || c == '>' || c == '&':
			return false
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return len(data) > 0
}

// UnmarshalEvent decodes the JSON wire form written by MarshalEvent and
// checks the envelope: ids, a positive version, a type matching its payload.
// Errors wrap ErrValidation or ErrUnknownEvent.
func UnmarshalEvent(b []byte) (Event, error) {
	if len(b) > maxEventJSONBytes {
		return Event{}, fmt.Errorf("decode event: %d bytes is over the %d limit: %w", len(b), maxEventJSONBytes, ErrValidation)
	}
	var w eventJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Event{}, fmt.Errorf("decode event: %v: %w", err, ErrValidation)
	}
	if trailing(b, dec) {
		return Event{}, fmt.Errorf("decode event: trailing data: %w", ErrValidation)
	}
	switch {
	case w.ID == "" || len(w.ID) > MaxIDLength:
		return Event{}, fmt.Errorf("decode event: bad event_id: %w", ErrValidation)
	case !validID(w.StreamID):
		return Event{}, fmt.Errorf("decode event %s: bad stream_id: %w", w.ID, ErrValidation)
	case w.Version < 1:
		return Event{}, fmt.Errorf("decode event %s: version %d < 1: %w", w.ID, w.Version, ErrValidation)
	case !ValidTime(w.OccurredAt) || !ValidTime(w.RecordedAt):
		return Event{}, fmt.Errorf("decode event %s: times must be in years 1 to 9999 UTC: %w", w.ID, ErrValidation)
	}
	data, err := DecodeData(w.Type, w.Metadata.SchemaVersion, w.Data)
	if err != nil {
		return Event{}, fmt.Errorf("decode event %s: %w", w.ID, err)
	}
	e := w.Event
	e.OccurredAt, e.RecordedAt = Timestamp(w.OccurredAt), Timestamp(w.RecordedAt)
	e.Data, e.Metadata = data, w.Metadata
	return e, nil
}

// trailing reports whether anything but white space follows the value dec
// decoded from b. (dec.More is false before a stray '}' or ']'.)
func trailing(b []byte, dec *json.Decoder) bool {
	return len(bytes.TrimSpace(b[dec.InputOffset():])) > 0
}
