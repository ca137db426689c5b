//go:build ignore

// gen writes commits.jsonl and expected.json in the current directory:
// order streams whose events are stored in every schema version each event
// type has had, in the commit documents of the events collection as the
// binaries of each schema's time stored them, and the state each order
// folds to, computed here with plain arithmetic (not with package domain).
//
// Run it with "go run gen.go" in this directory. Its output is
// deterministic: adding a schema adds a generation below and lines to the
// files; the lines of the older schemas must stay byte for byte as they are.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Event type names as stored.
const (
	placed      = "OrderPlaced"
	approved    = "OrderApproved"
	invoiced    = "OrderInvoiced"
	processing  = "OrderProcessingStarted"
	shipped     = "OrderShipped"
	delivered   = "OrderDelivered"
	canceled    = "OrderCanceled"
	unavailable = "OrderMarkedUnavailable"
)

// paths are the lifecycles after OrderPlaced: every step the lifecycle
// table allows, every skip and every terminal state from every state it
// may follow.
var paths = [][]string{
	{},
	{approved},
	{approved, invoiced},
	{approved, invoiced, processing},
	{approved, invoiced, processing, shipped},
	{approved, invoiced, processing, shipped, delivered},
	{approved, shipped, delivered},
	{approved, invoiced, shipped, delivered},
	{approved, processing, shipped},
	{canceled},
	{approved, canceled},
	{approved, invoiced, canceled},
	{approved, invoiced, processing, canceled},
	{approved, invoiced, processing, shipped, canceled},
	{unavailable},
	{approved, unavailable},
	{approved, invoiced, unavailable},
	{approved, processing, unavailable},
}

// status is the status each event type leads to.
var status = map[string]string{
	placed: "created", approved: "approved", invoiced: "invoiced", processing: "processing",
	shipped: "shipped", delivered: "delivered", canceled: "canceled", unavailable: "unavailable",
}

// stamp is the field of the folded order each event type sets.
var stamp = map[string]string{
	placed: "placed_at", approved: "approved_at", invoiced: "invoiced_at", processing: "processing_at",
	shipped: "shipped_at", delivered: "delivered_at", canceled: "canceled_at", unavailable: "unavailable_at",
}

// generation is the schema of every event type at one time of the log,
// and when that time began.
type generation struct {
	tag     string
	schemas map[string]int32
	base    time.Time
}

var generations = []generation{
	{tag: "v1", base: time.Date(2025, 3, 3, 8, 0, 0, 0, time.UTC), schemas: map[string]int32{
		placed: 1, approved: 1, invoiced: 1, processing: 1, shipped: 1, delivered: 1, canceled: 1, unavailable: 1}},
	// OrderPlaced schema 2: items[].freight_cents, omitted when zero.
	{tag: "v2", base: time.Date(2026, 2, 2, 8, 0, 0, 0, time.UTC), schemas: map[string]int32{
		placed: 2, approved: 1, invoiced: 1, processing: 1, shipped: 1, delivered: 1, canceled: 1, unavailable: 1}},
}

type line struct {
	sku                     string
	qty, price, lineFreight int64
}

func main() {
	var commits bytes.Buffer
	var expected []bson.D
	for _, g := range generations {
		for i, path := range paths {
			id := fmt.Sprintf("old-%s-%02d", g.tag, i+1)
			docs, want := order(g, i, id, path)
			for _, d := range docs {
				b, err := bson.MarshalExtJSON(d, true, false)
				if err != nil {
					panic(err)
				}
				commits.Write(b)
				commits.WriteByte('\n')
			}
			expected = append(expected, want)
		}
	}
	if err := os.WriteFile("commits.jsonl", commits.Bytes(), 0o644); err != nil {
		panic(err)
	}
	var exp bytes.Buffer
	exp.WriteString("[\n")
	for i, d := range expected {
		b, err := bson.MarshalExtJSON(d, false, false)
		if err != nil {
			panic(err)
		}
		exp.WriteString("  ")
		exp.Write(b)
		if i < len(expected)-1 {
			exp.WriteString(",")
		}
		exp.WriteString("\n")
	}
	exp.WriteString("]\n")
	if err := os.WriteFile("expected.json", exp.Bytes(), 0o644); err != nil {
		panic(err)
	}
}

// order returns the commit documents of order id, placed in generation g
// and then taken along path, and the order's expected state.
func order(g generation, i int, id string, path []string) ([]bson.D, bson.D) {
	customer := fmt.Sprintf("old-cust-%d", i%5)
	currency := []string{"BRL", "BRL", "EUR"}[i%3]
	lines := []line{{sku: fmt.Sprintf("sku-%02d-a", i), qty: int64(1 + i%3), price: int64(1990 + 113*i)}}
	if i%2 == 0 {
		lines = append(lines, line{sku: fmt.Sprintf("sku-%02d-b", i), qty: 2, price: 450})
	}
	orderFreight := int64(700 + 10*i)
	if i%4 == 3 {
		orderFreight = 0
	}
	if g.schemas[placed] >= 2 {
		lines[0].lineFreight = int64(150 * (i % 3))
		if len(lines) > 1 {
			lines[1].lineFreight = 85
		}
	}
	var items bson.A
	var subtotal, freight, count int64
	freight = orderFreight
	for _, l := range lines {
		item := bson.D{{Key: "sku", Value: l.sku}, {Key: "quantity", Value: int32(l.qty)}, {Key: "unit_price_cents", Value: int32(l.price)}}
		if l.lineFreight != 0 {
			item = append(item, bson.E{Key: "freight_cents", Value: int32(l.lineFreight)})
		}
		items = append(items, item)
		subtotal += l.qty * l.price
		freight += l.lineFreight
		count += l.qty
	}
	payloads := []bson.D{{{Key: "customer_id", Value: customer}, {Key: "currency", Value: currency},
		{Key: "items", Value: items}, {Key: "freight_cents", Value: int32(orderFreight)}}}
	types := append([]string{placed}, path...)
	reason := ""
	for _, t := range path {
		switch {
		case t == canceled && i%2 == 0:
			reason = "customer changed mind"
			payloads = append(payloads, bson.D{{Key: "reason", Value: reason}})
		case t == unavailable:
			reason = "out of stock"
			payloads = append(payloads, bson.D{{Key: "reason", Value: reason}})
		default:
			payloads = append(payloads, bson.D{})
		}
	}

	placedAt := g.base.Add(time.Duration(i)*37*time.Minute + time.Duration(i*123)*time.Millisecond)
	at := func(v int) time.Time { return placedAt.Add(time.Duration(v-1) * (26*time.Hour + 17*time.Minute)) }
	want := bson.D{{Key: "order_id", Value: id}, {Key: "customer_id", Value: customer}, {Key: "status", Value: status[types[len(types)-1]]},
		{Key: "currency", Value: currency}}
	var wantItems bson.A
	for _, l := range lines {
		item := bson.D{{Key: "sku", Value: l.sku}, {Key: "quantity", Value: l.qty}, {Key: "unit_price_cents", Value: l.price}}
		if l.lineFreight != 0 {
			item = append(item, bson.E{Key: "freight_cents", Value: l.lineFreight})
		}
		wantItems = append(wantItems, item)
	}
	want = append(want, bson.D{{Key: "items", Value: wantItems}, {Key: "item_count", Value: count}, {Key: "subtotal_cents", Value: subtotal},
		{Key: "freight_cents", Value: freight}, {Key: "total_cents", Value: subtotal + freight}}...)
	for v, t := range types {
		want = append(want, bson.E{Key: stamp[t], Value: at(v + 1).Format(time.RFC3339Nano)})
	}
	if reason != "" {
		want = append(want, bson.E{Key: "reason", Value: reason})
	}
	// recorded_at: the commit of the last event was stored 1.5 s after it
	// happened (below).
	want = append(want, bson.D{{Key: "recorded_at", Value: at(len(types)).Add(1500 * time.Millisecond).Format(time.RFC3339Nano)},
		{Key: "version", Value: int64(len(types))}, {Key: "updated_at", Value: at(len(types)).Format(time.RFC3339Nano)},
		{Key: "path", Value: strings.Join(types, " ")}}...)

	// One or two events a commit, as one command or an import of two
	// steps stored them; the first commit of every other order carries
	// the idempotency key of the request that placed it.
	perCommit := 1 + i%2
	var docs []bson.D
	for first := 1; first <= len(types); first += perCommit {
		last := min(first+perCommit-1, len(types))
		recorded := bson.NewDateTimeFromTime(at(last).Add(1500 * time.Millisecond))
		var events bson.A
		cmd := uuid(id, "command", first)
		for v := first; v <= last; v++ {
			events = append(events, bson.D{
				{Key: "event_id", Value: uuid(id, "event", v)}, {Key: "type", Value: types[v-1]}, {Key: "version", Value: int64(v)},
				{Key: "occurred_at", Value: bson.NewDateTimeFromTime(at(v))}, {Key: "recorded_at", Value: recorded},
				{Key: "data", Value: payloads[v-1]}, {Key: "correlation_id", Value: cmd}, {Key: "causation_id", Value: cmd},
				{Key: "schema_version", Value: g.schemas[types[v-1]]},
			})
		}
		doc := bson.D{
			{Key: "_id", Value: fmt.Sprintf("%s:%010d", id, first)}, {Key: "stream_id", Value: id}, {Key: "stream_type", Value: "order"},
			{Key: "first_version", Value: int64(first)}, {Key: "last_version", Value: int64(last)}, {Key: "events", Value: events},
			{Key: "recorded_at", Value: recorded}, {Key: "published", Value: true},
			{Key: "published_at", Value: bson.NewDateTimeFromTime(recorded.Time().Add(40 * time.Millisecond))},
		}
		if first == 1 && i%2 == 0 {
			doc = append(doc, bson.E{Key: "idempotency_key", Value: "key-" + id},
				bson.E{Key: "request_hash", Value: hash(id, "request", 1)[:32]})
		}
		docs = append(docs, doc)
	}
	return docs, want
}

// uuid is a version 4 UUID made of the hash of its arguments.
func uuid(id, kind string, n int) string {
	h := hash(id, kind, n)
	return fmt.Sprintf("%s-%s-4%s-a%s-%s", h[0:8], h[8:12], h[13:16], h[17:20], h[20:32])
}

func hash(id, kind string, n int) string {
	s := sha256.Sum256([]byte(fmt.Sprintf("%s/%s/%d", id, kind, n)))
	return hex.EncodeToString(s[:])
}
