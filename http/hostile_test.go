package http_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	orderhttp "github.com/orderd/orderd/http"
)

// Invariant 8: bad input gets a 4xx problem document and appends nothing.

const (
	items1 = `"items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 100}]`
	base   = `"customer_id": "c-1", "currency": "BRL", ` + items1
)

// withCustomer is a place body with customer_id set to the JSON value v.
func withCustomer(v string) string {
	return `{"customer_id": ` + v + `, "currency": "BRL", ` + items1 + `}`
}

// withItem is a place body with one line of the given JSON fields.
func withItem(fields string) string {
	return `{"customer_id": "c-1", "currency": "BRL", "items": [{` + fields + `}]}`
}

func manyItems(n int) string {
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"sku": "s%d", "quantity": 1, "unit_price_cents": 1}`, i)
	}
	return `{"customer_id": "c-1", "currency": "BRL", "items": [` + strings.Join(lines, ",") + `]}`
}

type hostileCase struct {
	name   string
	path   string // default /v1/orders
	body   string
	header map[string]string
	status int
	typ    string
	fields []string
	bug    string // a known bug: the case is skipped unless -known-bugs
}

func runHostile(t *testing.T, tests []hostileCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.bug != "" {
				knownBug(t, tt.bug)
			}
			e := newEnv(t)
			e.place(t, "o-1")
			commits := e.store.Commits()
			path := tt.path
			if path == "" {
				path = "/v1/orders"
			}
			rec := e.do(t, req{Method: http.MethodPost, Path: path, Body: tt.body, Header: tt.header})
			wantProblem(t, rec, tt.status, tt.typ, tt.fields...)
			if n := e.store.Commits(); n != commits {
				t.Errorf("store holds %d commits, want %d", n, commits)
			}
		})
	}
}

const (
	malformed   = "/problems/malformed"
	validation  = "/problems/validation"
	unsupported = "/problems/unsupported"
	tooLarge    = "/problems/too-large"
)

func TestPlaceHostileBody(t *testing.T) {
	runHostile(t, []hostileCase{
		// Syntax and shape.
		{name: "malformed JSON", body: `{"customer_id": "c-1",`, status: 400, typ: malformed},
		{name: "not JSON", body: `customer_id=c-1`, status: 400, typ: malformed},
		{name: "single quotes", body: `{'customer_id': 'c-1'}`, status: 400, typ: malformed},
		{name: "empty body", body: ``, header: map[string]string{"Content-Type": "application/json"}, status: 400, typ: malformed},
		{name: "blank body", body: " \n\t", status: 400, typ: malformed},
		{name: "trailing object", body: placeBody("o-2") + `{}`, status: 400, typ: malformed},
		{name: "trailing garbage", body: placeBody("o-2") + ` x`, status: 400, typ: malformed},
		{name: "trailing second body", body: placeBody("o-2") + "\n" + placeBody("o-3"), status: 400, typ: malformed},
		{name: "trailing brace", body: placeBody("o-2") + `}`, status: 400, typ: malformed},
		{name: "trailing bracket", body: placeBody("o-2") + `]`, status: 400, typ: malformed},
		{name: "JSON array", body: `[` + placeBody("o-2") + `]`, status: 400, typ: malformed},
		{name: "JSON string", body: `"o-2"`, status: 400, typ: malformed},
		{name: "JSON null", body: `null`, status: 400, typ: malformed},
		{name: "JSON number", body: `1`, status: 400, typ: malformed},
		{name: "empty object", body: `{}`, status: 422, typ: validation, fields: []string{"customer_id", "currency", "items"}},
		{name: "unknown field", body: `{` + base + `, "admin": true}`, status: 400, typ: malformed},
		{name: "unknown field in item", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1, "discount": 5`), status: 400, typ: malformed},
		{name: "unknown operator field", body: `{` + base + `, "$where": "1"}`, status: 400, typ: malformed},
		{name: "case-folded duplicate of a field", body: `{` + base + `, "Customer_ID": "c-2"}`, status: 400, typ: malformed},
		{name: "duplicate field", body: `{"customer_id": "c-1", "customer_id": "c-2", "currency": "BRL", ` + items1 + `}`, status: 400, typ: malformed},
		{name: "deep nesting", body: strings.Repeat("[", 20000) + strings.Repeat("]", 20000), status: 400, typ: malformed},

		// Media type.
		{name: "text/plain", body: placeBody("o-2"), header: map[string]string{"Content-Type": "text/plain"}, status: 415, typ: unsupported},
		{name: "form", body: placeBody("o-2"), header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, status: 415, typ: unsupported},
		{name: "no Content-Type", body: placeBody("o-2"), header: map[string]string{"Content-Type": ""}, status: 415, typ: unsupported},
		{name: "bad Content-Type", body: placeBody("o-2"), header: map[string]string{"Content-Type": "application/json; ===="}, status: 415, typ: unsupported},
		{name: "jsonx", body: placeBody("o-2"), header: map[string]string{"Content-Type": "application/jsonx"}, status: 415, typ: unsupported},

		// Ids: operator injection and characters that are not allowed.
		{name: "customer_id operator object", body: withCustomer(`{"$gt": ""}`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id array", body: withCustomer(`["c-1"]`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id number", body: withCustomer(`1`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id dotted", body: withCustomer(`"a.b"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id $where", body: withCustomer(`"$where"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id 65 chars", body: withCustomer(`"` + strings.Repeat("c", 65) + `"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id non-UTF-8", body: withCustomer("\"c\xff\xfe\""), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id non-ASCII", body: withCustomer(`"cliënt"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id space", body: withCustomer(`"c 1"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id NUL escape", body: withCustomer(`"c\u0000"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id NATS wildcard", body: withCustomer(`"c.>"`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "customer_id empty", body: withCustomer(`""`), status: 422, typ: validation, fields: []string{"customer_id"}},
		{name: "order_id dotted", body: `{"order_id": "a.b", ` + base + `}`, status: 422, typ: validation, fields: []string{"order_id"}},
		{name: "order_id $where", body: `{"order_id": "$where", ` + base + `}`, status: 422, typ: validation, fields: []string{"order_id"}},
		{name: "order_id 65 chars", body: `{"order_id": "` + strings.Repeat("o", 65) + `", ` + base + `}`, status: 422, typ: validation, fields: []string{"order_id"}},
		{name: "order_id operator object", body: `{"order_id": {"$ne": null}, ` + base + `}`, status: 422, typ: validation, fields: []string{"order_id"}},
		{name: "sku slash", body: withItem(`"sku": "a/b", "quantity": 1, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].sku"}},
		{name: "sku operator", body: withItem(`"sku": {"$regex": ".*"}, "quantity": 1, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].sku"}},

		// Amounts.
		{name: "quantity zero", body: withItem(`"sku": "s", "quantity": 0, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity negative", body: withItem(`"sku": "s", "quantity": -1, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity over max", body: withItem(`"sku": "s", "quantity": 1000001, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity overflow", body: withItem(`"sku": "s", "quantity": 9223372036854775808, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "type error names the line", body: `{"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "a", "quantity": 1, "unit_price_cents": 1}, {"sku": "b", "quantity": 1.5, "unit_price_cents": 1}]}`,
			status: 422, typ: validation, fields: []string{"items[1].quantity"}},
		{name: "range error names the line", body: `{"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "a", "quantity": 1, "unit_price_cents": 1}, {"sku": "b", "quantity": 0, "unit_price_cents": 1}]}`,
			status: 422, typ: validation, fields: []string{"items[1].quantity"}},
		{name: "type error in white space names the line", body: `{ "customer_id" : "c-1" , "currency" : "BRL" , "items" : [ { "sku" : "a" , "quantity" : 1 , "unit_price_cents" : 1 } , { "sku" : "b" , "quantity" : true , "unit_price_cents" : 1 } ] }`,
			status: 422, typ: validation, fields: []string{"items[1].quantity"}},
		{name: "price string names the line", body: `{"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "a", "quantity": 1, "unit_price_cents": 1}, {"sku": "b", "quantity": 1, "unit_price_cents": "1"}]}`,
			status: 422, typ: validation, fields: []string{"items[1].unit_price_cents"}},
		{name: "line not an object", body: `{"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "a", "quantity": 1, "unit_price_cents": 1}, "b"]}`,
			status: 422, typ: validation, fields: []string{"items[1]"}},
		{name: "items not an array", body: `{"customer_id": "c-1", "currency": "BRL", "items": {"sku": "a"}}`, status: 422, typ: validation, fields: []string{"items"}},
		{name: "quantity fraction", body: withItem(`"sku": "s", "quantity": 1.5, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity exponent", body: withItem(`"sku": "s", "quantity": 1e3, "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity string", body: withItem(`"sku": "s", "quantity": "1", "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "quantity missing", body: withItem(`"sku": "s", "unit_price_cents": 1`), status: 422, typ: validation, fields: []string{"items[0].quantity"}},
		{name: "price negative", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": -1`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "price over max", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1000000000001`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "price overflow", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 9223372036854775808`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "price huge negative", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": -99999999999999999999999`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "price missing", body: withItem(`"sku": "s", "quantity": 1`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "price null", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": null`), status: 422, typ: validation, fields: []string{"items[0].unit_price_cents"}},
		{name: "freight negative", body: `{` + base + `, "freight_cents": -1}`, status: 422, typ: validation, fields: []string{"freight_cents"}},
		{name: "freight overflow", body: `{` + base + `, "freight_cents": 9223372036854775808}`, status: 422, typ: validation, fields: []string{"freight_cents"}},
		{name: "line freight negative", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1, "freight_cents": -1`), status: 422, typ: validation, fields: []string{"items[0].freight_cents"}},
		{name: "line freight over max", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1, "freight_cents": 1000000000001`), status: 422, typ: validation, fields: []string{"items[0].freight_cents"}},
		{name: "line freight fraction", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1, "freight_cents": 8.72`), status: 422, typ: validation, fields: []string{"items[0].freight_cents"}},
		{name: "line freight string", body: withItem(`"sku": "s", "quantity": 1, "unit_price_cents": 1, "freight_cents": "872"`), status: 422, typ: validation, fields: []string{"items[0].freight_cents"}},
		{name: "item null", body: `{"customer_id": "c-1", "currency": "BRL", "items": [null]}`, status: 422, typ: validation, fields: []string{"items[0].sku"}},

		// Lines.
		{name: "no items", body: `{"customer_id": "c-1", "currency": "BRL", "items": []}`, status: 422, typ: validation, fields: []string{"items"}},
		{name: "items null", body: `{"customer_id": "c-1", "currency": "BRL", "items": null}`, status: 422, typ: validation, fields: []string{"items"}},
		{name: "items object", body: `{"customer_id": "c-1", "currency": "BRL", "items": {}}`, status: 422, typ: validation, fields: []string{"items"}},
		{name: "501 items", body: manyItems(501), status: 422, typ: validation, fields: []string{"items"}},

		// Currency.
		{name: "currency lower case", body: `{"customer_id": "c-1", "currency": "brl", ` + items1 + `}`, status: 422, typ: validation, fields: []string{"currency"}},
		{name: "currency short", body: `{"customer_id": "c-1", "currency": "BR", ` + items1 + `}`, status: 422, typ: validation, fields: []string{"currency"}},
		{name: "currency non-ASCII", body: `{"customer_id": "c-1", "currency": "ÄÖÜ", ` + items1 + `}`, status: 422, typ: validation, fields: []string{"currency"}},

		// Times.
		{name: "at yesterday", body: `{` + base + `, "at": "yesterday"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at month 13", body: `{` + base + `, "at": "2017-13-01T00:00:00Z"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at without zone", body: `{` + base + `, "at": "2017-10-01T00:00:00"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at year 0000 with offset", body: `{` + base + `, "at": "0000-01-01T00:30:00+01:00"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at year 0000", body: `{` + base + `, "at": "0000-06-01T00:00:00Z"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at year 10000 in UTC", body: `{` + base + `, "at": "9999-12-31T23:30:00-01:00"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at number", body: `{` + base + `, "at": 1506941793}`, status: 422, typ: validation, fields: []string{"at"}},

		// Headers.
		{name: "Idempotency-Key control character", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": "k\x01"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key newline", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": "k\nX-Admin: 1"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key DEL", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": "k\x7f"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key space", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": "a b"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key non-ASCII", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": "ключ"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key 129 chars", body: placeBody("o-2"), header: map[string]string{"Idempotency-Key": strings.Repeat("k", 129)}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "X-Correlation-ID 129 chars", body: placeBody("o-2"), header: map[string]string{"X-Correlation-ID": strings.Repeat("c", 129)}, status: 422, typ: validation, fields: []string{"X-Correlation-ID"}},
		{name: "X-Correlation-ID tab", body: placeBody("o-2"), header: map[string]string{"X-Correlation-ID": "a\tb"}, status: 422, typ: validation, fields: []string{"X-Correlation-ID"}},
	})
}

func TestLifecycleHostileBody(t *testing.T) {
	runHostile(t, []hostileCase{
		{name: "malformed JSON", path: "/v1/orders/o-1/cancel", body: `{"reason": `, status: 400, typ: malformed},
		{name: "trailing data", path: "/v1/orders/o-1/approve", body: `{} {}`, status: 400, typ: malformed},
		{name: "trailing brace", path: "/v1/orders/o-1/approve", body: `{}}`, status: 400, typ: malformed},
		{name: "JSON array", path: "/v1/orders/o-1/cancel", body: `[]`, status: 400, typ: malformed},
		{name: "JSON null", path: "/v1/orders/o-1/cancel", body: `null`, status: 400, typ: malformed},
		{name: "vertical tab body", path: "/v1/orders/o-1/approve", body: "\v", status: 400, typ: malformed},
		{name: "no-break space body", path: "/v1/orders/o-1/cancel", body: "\u00a0", status: 400, typ: malformed},
		{name: "unknown field", path: "/v1/orders/o-1/approve", body: `{"reason": "approve has none"}`, status: 400, typ: malformed},
		{name: "unknown field on cancel", path: "/v1/orders/o-1/cancel", body: `{"reason": "r", "refund": true}`, status: 400, typ: malformed},
		{name: "text/plain", path: "/v1/orders/o-1/cancel", body: `{"reason": "r"}`, header: map[string]string{"Content-Type": "text/plain"}, status: 415, typ: unsupported},
		{name: "no Content-Type", path: "/v1/orders/o-1/approve", body: `{}`, header: map[string]string{"Content-Type": ""}, status: 415, typ: unsupported},
		{name: "reason 501 bytes", path: "/v1/orders/o-1/cancel", body: `{"reason": "` + strings.Repeat("r", 501) + `"}`, status: 422, typ: validation, fields: []string{"reason"}},
		{name: "reason 300 runes of 2 bytes", path: "/v1/orders/o-1/cancel", body: `{"reason": "` + strings.Repeat("é", 300) + `"}`, status: 422, typ: validation, fields: []string{"reason"}},
		{name: "reason 501 bytes on mark-unavailable", path: "/v1/orders/o-1/mark-unavailable", body: `{"reason": "` + strings.Repeat("r", 501) + `"}`, status: 422, typ: validation, fields: []string{"reason"}},
		{name: "reason object", path: "/v1/orders/o-1/cancel", body: `{"reason": {"$gt": ""}}`, status: 422, typ: validation, fields: []string{"reason"}},
		{name: "at yesterday", path: "/v1/orders/o-1/approve", body: `{"at": "yesterday"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at month 13", path: "/v1/orders/o-1/ship", body: `{"at": "2017-13-01T00:00:00Z"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at year 0000 with offset", path: "/v1/orders/o-1/cancel", body: `{"at": "0000-01-01T00:00:00+01:00"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "at year 0000 on unknown order", path: "/v1/orders/nope/approve", body: `{"at": "0000-01-01T00:00:00+01:00"}`, status: 422, typ: validation, fields: []string{"at"}},
		{name: "Idempotency-Key control character", path: "/v1/orders/o-1/approve", header: map[string]string{"Idempotency-Key": "\x00"}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},
		{name: "Idempotency-Key 129 chars", path: "/v1/orders/o-1/approve", header: map[string]string{"Idempotency-Key": strings.Repeat("k", 129)}, status: 422, typ: validation, fields: []string{"Idempotency-Key"}},

		// Path ids are checked before any query: 422 on commands.
		{name: "path id dotted", path: "/v1/orders/a.b/approve", status: 422, typ: validation},
		{name: "path id $where", path: "/v1/orders/$where/cancel", status: 422, typ: validation},
		{name: "path id escaped $", path: "/v1/orders/%24where/cancel", status: 422, typ: validation},
		{name: "path id 65 chars", path: "/v1/orders/" + strings.Repeat("o", 65) + "/approve", status: 422, typ: validation},
		{name: "path id space", path: "/v1/orders/a%20b/approve", status: 422, typ: validation},
		{name: "path id non-UTF-8", path: "/v1/orders/a%FF/approve", status: 422, typ: validation},
		{name: "path id NATS wildcard", path: "/v1/orders/%3E/ship", status: 422, typ: validation},
	})
}

// TestBodyLimit sends bodies around the 1 MiB limit, with a Content-Length
// and chunked (no length known up front).
func TestBodyLimit(t *testing.T) {
	// A valid body padded with white space to n bytes.
	body := func(n int) string {
		b := placeBody("o-2")
		return b + strings.Repeat(" ", n-len(b))
	}
	tests := []struct {
		name    string
		n       int
		chunked bool
		status  int
	}{
		{name: "1 MiB", n: 1 << 20, status: http.StatusCreated},
		{name: "1 MiB chunked", n: 1 << 20, chunked: true, status: http.StatusCreated},
		{name: "1 MiB + 1", n: 1<<20 + 1, status: http.StatusRequestEntityTooLarge},
		{name: "1 MiB + 1 chunked", n: 1<<20 + 1, chunked: true, status: http.StatusRequestEntityTooLarge},
		{name: "8 MiB chunked", n: 8 << 20, chunked: true, status: http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			var r io.Reader = strings.NewReader(body(tt.n))
			hr := httptest.NewRequest(http.MethodPost, "/v1/orders", r)
			hr.Header.Set("Content-Type", "application/json")
			if tt.chunked {
				hr.ContentLength = -1
				hr.Body = io.NopCloser(io.MultiReader(r)) // hide the length
			}
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, hr)
			if tt.status == http.StatusCreated {
				if rec.Code != tt.status {
					t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
				}
				return
			}
			wantProblem(t, rec, tt.status, tooLarge)
			if n := e.store.Commits(); n != 0 {
				t.Errorf("store holds %d commits, want 0", n)
			}
		})
	}
}

// TestBodyLimitOverTheWire checks the limit through a real server and
// client, where the declared length is refused before the body is read.
func TestBodyLimitOverTheWire(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	big := bytes.Repeat([]byte(" "), 2<<20)
	resp, err := http.Post(srv.URL+"/v1/orders", "application/json", bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Content-Type") != "application/problem+json" ||
		!bytes.Contains(b, []byte(`"type":"/problems/too-large"`)) {
		t.Errorf("%d %s %s, want 413 /problems/too-large", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
}

// TestInvalidPathIDOnGet: a GET with an id that cannot exist is 404.
func TestInvalidPathIDOnGet(t *testing.T) {
	ids := []string{"a.b", "$where", "%24where", strings.Repeat("o", 65), "a%20b", "a%FF", "%3E", "a*"}
	routes := []string{"/v1/orders/%s", "/v1/orders/%s/events", "/v1/order-summaries/%s", "/v1/order-summaries/%s?min_version=1&wait=10ms", "/v1/customers/%s/order-stats"}
	e := newEnv(t)
	for _, id := range ids {
		for _, r := range routes {
			path := fmt.Sprintf(r, id)
			t.Run(path, func(t *testing.T) {
				rec := e.get(t, path)
				p := wantProblem(t, rec, http.StatusNotFound, "/problems/not-found")
				if len(p.Errors) != 0 {
					t.Errorf("404 with field errors %+v", p.Errors)
				}
			})
		}
	}
	if e.reads.calls != 0 || len(e.reads.lists) != 0 {
		t.Errorf("invalid ids reached the read models: %d calls", e.reads.calls)
	}
}

// TestTooLargeBodyAnswered: a client that sends its whole body, declared
// by Content-Length, before it reads the answer (as Python's http.client
// does) gets the 413 problem document, not a broken pipe; a client that
// waits for 100 Continue gets it at once and sends no body.
func TestTooLargeBodyAnswered(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) { c.ReadTimeout = time.Minute })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = e.srv.Shutdown(context.Background())
		<-served
	})
	body := bytes.Repeat([]byte(" "), 8<<20)
	for _, tc := range []struct {
		name     string
		expect   bool
		sendBody bool
	}{
		{"whole body, then read", false, true},
		{"100-continue", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// A deadline against a hang only: the server's read timeout
			// is a minute.
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			head := fmt.Sprintf("POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", len(body))
			if tc.expect {
				head += "Expect: 100-continue\r\n"
			}
			if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
				t.Fatal(err)
			}
			if tc.sendBody {
				if _, err := conn.Write(body); err != nil {
					t.Fatalf("sending the body: %v", err)
				}
			}
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatalf("reading the answer's body: %v", err)
			}
			var p orderhttp.Problem
			if res.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &p) != nil || p.Type != tooLarge || p.Status != http.StatusRequestEntityTooLarge {
				t.Errorf("answer %d %s, want the 413 problem document", res.StatusCode, b)
			}
			if !res.Close {
				t.Error("the answer does not close the connection")
			}
		})
	}
}
