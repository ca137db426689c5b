package http_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/orderd/orderd/domain"
)

func TestPlace(t *testing.T) {
	e := newEnv(t)
	rec := e.post(t, "/v1/orders", placeBody("o-1"))
	wantCommand(t, rec, http.StatusCreated, commandAnswer{OrderID: "o-1", Version: 1, Status: "created"}, false)
	if loc := rec.Header().Get("Location"); loc != "/v1/orders/o-1" {
		t.Errorf("Location = %q, want /v1/orders/o-1", loc)
	}
	evs := e.store.Events("o-1")
	if len(evs) != 1 || evs[0].Type != domain.TypeOrderPlaced {
		t.Fatalf("stream o-1 = %+v, want one OrderPlaced", evs)
	}
	want := domain.OrderPlaced{CustomerID: "c-1", Currency: "BRL", FreightCents: 300,
		Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1250}}}
	got, _ := json.Marshal(evs[0].Data)
	if w, _ := json.Marshal(want); string(got) != string(w) {
		t.Errorf("OrderPlaced = %s, want %s", got, w)
	}
}

// TestPlaceFreightPerLine: each item may carry its own freight_cents (as
// Olist's order_items.freight_value); it is stored on the line and counted
// in the order's freight and total, next to an order-level freight_cents.
func TestPlaceFreightPerLine(t *testing.T) {
	e := newEnv(t)
	rec := e.post(t, "/v1/orders", placeBodyWith("o-1", `"customer_id": "c-1", "currency": "BRL", "items": [`+
		`{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250, "freight_cents": 872},`+
		`{"sku": "sku-2", "quantity": 1, "unit_price_cents": 990}], "freight_cents": 100`))
	wantCommand(t, rec, http.StatusCreated, commandAnswer{OrderID: "o-1", Version: 1, Status: "created"}, false)
	evs := e.store.Events("o-1")
	want := domain.OrderPlaced{CustomerID: "c-1", Currency: "BRL", FreightCents: 100, Items: []domain.Line{
		{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1250, FreightCents: 872}, {SKU: "sku-2", Quantity: 1, UnitPriceCents: 990}}}
	if len(evs) != 1 || !reflect.DeepEqual(evs[0].Data, want) {
		t.Fatalf("stream o-1 = %+v, want one %+v", evs, want)
	}

	rec = e.get(t, "/v1/orders/o-1")
	var o struct {
		Items []struct {
			SKU          string `json:"sku"`
			FreightCents *int64 `json:"freight_cents"`
		} `json:"items"`
		SubtotalCents int64 `json:"subtotal_cents"`
		FreightCents  int64 `json:"freight_cents"`
		TotalCents    int64 `json:"total_cents"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/orders/o-1: %d %s", rec.Code, rec.Body)
	}
	if o.SubtotalCents != 2*1250+990 || o.FreightCents != 872+100 || o.TotalCents != 2*1250+990+872+100 {
		t.Errorf("subtotal %d, freight %d, total %d; want %d, %d, %d", o.SubtotalCents, o.FreightCents, o.TotalCents,
			2*1250+990, 872+100, 2*1250+990+872+100)
	}
	if len(o.Items) != 2 || o.Items[0].FreightCents == nil || *o.Items[0].FreightCents != 872 || o.Items[1].FreightCents != nil {
		t.Errorf("items %s; want the first with freight_cents 872, the second without", rec.Body)
	}

	// The same lines again are the same placement; other line freight is not.
	rec = e.post(t, "/v1/orders", placeBodyWith("o-1", `"customer_id": "c-1", "currency": "BRL", "items": [`+
		`{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250, "freight_cents": 872},`+
		`{"sku": "sku-2", "quantity": 1, "unit_price_cents": 990, "freight_cents": 0}], "freight_cents": 100`))
	wantCommand(t, rec, http.StatusCreated, commandAnswer{OrderID: "o-1", Version: 1, Status: "created"}, true)
	rec = e.post(t, "/v1/orders", placeBodyWith("o-1", `"customer_id": "c-1", "currency": "BRL", "items": [`+
		`{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250, "freight_cents": 972},`+
		`{"sku": "sku-2", "quantity": 1, "unit_price_cents": 990}]`))
	wantProblem(t, rec, http.StatusConflict, "/problems/already-exists")
}

func TestPlaceGeneratesID(t *testing.T) {
	e := newEnv(t)
	rec := e.post(t, "/v1/orders", placeBody(""))
	wantCommand(t, rec, http.StatusCreated, commandAnswer{Version: 1, Status: "created"}, false)
	var got commandAnswer
	_ = json.Unmarshal(rec.Body.Bytes(), &got)
	if err := domain.ValidateID("order id", got.OrderID); err != nil {
		t.Fatalf("generated order id: %v", err)
	}
	if loc := rec.Header().Get("Location"); loc != "/v1/orders/"+got.OrderID {
		t.Errorf("Location = %q, want /v1/orders/%s", loc, got.OrderID)
	}
	if n := len(e.store.Events(got.OrderID)); n != 1 {
		t.Errorf("stream %s has %d events, want 1", got.OrderID, n)
	}
	// Without an id and without a key, a second request is another order.
	rec = e.post(t, "/v1/orders", placeBody(""))
	var second commandAnswer
	_ = json.Unmarshal(rec.Body.Bytes(), &second)
	if rec.Code != http.StatusCreated || second.OrderID == got.OrderID {
		t.Errorf("second place without id: %d %s, want 201 with a new id", rec.Code, rec.Body)
	}
}

func TestPlaceAgain(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		status   int
		problem  string
		replayed bool
	}{
		{name: "identical", body: placeBody("o-1"), status: http.StatusCreated, replayed: true},
		{name: "identical, fields reordered", status: http.StatusCreated, replayed: true,
			body: `{"freight_cents": 300, "items": [{"unit_price_cents": 1250, "quantity": 2, "sku": "sku-1"}], "currency": "BRL", "customer_id": "c-1", "order_id": "o-1"}`},
		{name: "other customer", body: placeBodyWith("o-1", `"customer_id": "c-2", "currency": "BRL", "items": [{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250}], "freight_cents": 300`),
			status: http.StatusConflict, problem: "/problems/already-exists"},
		{name: "other quantity", body: placeBodyWith("o-1", `"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "sku-1", "quantity": 3, "unit_price_cents": 1250}], "freight_cents": 300`),
			status: http.StatusConflict, problem: "/problems/already-exists"},
		{name: "other freight", body: placeBodyWith("o-1", `"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "sku-1", "quantity": 2, "unit_price_cents": 1250}]`),
			status: http.StatusConflict, problem: "/problems/already-exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			e.run(t, "o-1", "approve")
			rec := e.post(t, "/v1/orders", tt.body)
			if tt.problem != "" {
				wantProblem(t, rec, tt.status, tt.problem)
			} else {
				// The existing order as it is now, not as placed.
				wantCommand(t, rec, tt.status, commandAnswer{OrderID: "o-1", Version: 2, Status: "approved"}, tt.replayed)
			}
			if n := e.store.Commits(); n != 2 {
				t.Errorf("store holds %d commits, want 2", n)
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	tests := []struct {
		name   string
		before []string // commands run first
		cmd    string
		body   string
		want   commandAnswer
	}{
		{name: "approve", cmd: "approve", want: commandAnswer{Version: 2, Status: "approved"}},
		{name: "approve with at", cmd: "approve", body: `{"at": "2017-10-02T10:56:33Z"}`, want: commandAnswer{Version: 2, Status: "approved"}},
		{name: "invoice", before: []string{"approve"}, cmd: "invoice", want: commandAnswer{Version: 3, Status: "invoiced"}},
		{name: "process", before: []string{"approve", "invoice"}, cmd: "process", want: commandAnswer{Version: 4, Status: "processing"}},
		{name: "process without invoice", before: []string{"approve"}, cmd: "process", want: commandAnswer{Version: 3, Status: "processing"}},
		{name: "ship", before: []string{"approve", "invoice", "process"}, cmd: "ship", body: `{}`, want: commandAnswer{Version: 5, Status: "shipped"}},
		{name: "deliver", before: []string{"approve", "invoice", "process", "ship"}, cmd: "deliver", want: commandAnswer{Version: 6, Status: "delivered"}},
		{name: "cancel", cmd: "cancel", body: `{"reason": "customer changed their mind"}`, want: commandAnswer{Version: 2, Status: "canceled"}},
		{name: "cancel shipped", before: []string{"approve", "ship"}, cmd: "cancel", body: `{"reason": "lost", "at": "2018-01-01T00:00:00.123+03:00"}`, want: commandAnswer{Version: 4, Status: "canceled"}},
		{name: "cancel without body", cmd: "cancel", want: commandAnswer{Version: 2, Status: "canceled"}},
		{name: "cancel with reason of 500 bytes", cmd: "cancel", body: `{"reason": "` + strings.Repeat("r", 500) + `"}`, want: commandAnswer{Version: 2, Status: "canceled"}},
		{name: "mark unavailable", before: []string{"approve"}, cmd: "mark-unavailable", body: `{"reason": "out of stock"}`, want: commandAnswer{Version: 3, Status: "unavailable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			e.run(t, "o-1", tt.before...)
			rec := e.post(t, "/v1/orders/o-1/"+tt.cmd, tt.body)
			tt.want.OrderID = "o-1"
			wantCommand(t, rec, http.StatusOK, tt.want, false)
			if n := len(e.store.Events("o-1")); int64(n) != tt.want.Version {
				t.Errorf("stream holds %d events, want %d", n, tt.want.Version)
			}
		})
	}
}

func TestLifecycleEventData(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-1")
	rec := e.post(t, "/v1/orders/o-1/cancel", `{"reason": "fraud", "at": "2017-10-02T10:56:33.5-03:00"}`,
		"X-Correlation-ID", "corr-42")
	if rec.Code != http.StatusOK {
		t.Fatalf("cancel: %d %s", rec.Code, rec.Body)
	}
	evs := e.store.Events("o-1")
	last := evs[len(evs)-1]
	if d, ok := last.Data.(domain.OrderCanceled); !ok || d.Reason != "fraud" {
		t.Errorf("event data = %#v, want OrderCanceled{Reason: fraud}", last.Data)
	}
	if want := "2017-10-02T13:56:33.5Z"; last.OccurredAt.Format("2006-01-02T15:04:05.999Z07:00") != want {
		t.Errorf("occurred at %v, want %s", last.OccurredAt, want)
	}
	if last.Metadata.CorrelationID != "corr-42" {
		t.Errorf("correlation id %q, want corr-42", last.Metadata.CorrelationID)
	}
	if rid := rec.Header().Get("X-Request-Id"); rid == "" || last.Metadata.CausationID != rid {
		t.Errorf("causation id %q, want the request id %q", last.Metadata.CausationID, rid)
	}
}

func TestIdempotencyKey(t *testing.T) {
	tests := []struct {
		name string
		// first and retry are the two requests, both with the key k;
		// between runs requests without a key in between.
		first, retry req
		between      []req
		// want is the retry's answer: a replay of first, or a problem.
		wantStatus  int
		wantAnswer  commandAnswer
		wantProblem string
	}{
		{
			name:       "place without order id",
			first:      req{Path: "/v1/orders", Body: placeBody("")},
			retry:      req{Path: "/v1/orders", Body: placeBody("")},
			wantStatus: http.StatusCreated, wantAnswer: commandAnswer{Version: 1, Status: "created"},
		},
		{
			name:       "place with order id",
			first:      req{Path: "/v1/orders", Body: placeBody("o-9")},
			retry:      req{Path: "/v1/orders", Body: placeBody("o-9")},
			wantStatus: http.StatusCreated, wantAnswer: commandAnswer{OrderID: "o-9", Version: 1, Status: "created"},
		},
		{
			name:       "approve",
			first:      req{Path: "/v1/orders/o-1/approve"},
			retry:      req{Path: "/v1/orders/o-1/approve"},
			wantStatus: http.StatusOK, wantAnswer: commandAnswer{OrderID: "o-1", Version: 2, Status: "approved"},
		},
		{
			name:       "approve, retried after the order moved on",
			first:      req{Path: "/v1/orders/o-1/approve"},
			between:    []req{{Path: "/v1/orders/o-1/invoice"}, {Path: "/v1/orders/o-1/process"}},
			retry:      req{Path: "/v1/orders/o-1/approve"},
			wantStatus: http.StatusOK, wantAnswer: commandAnswer{OrderID: "o-1", Version: 2, Status: "approved"},
		},
		{
			name:       "cancel with reason",
			first:      req{Path: "/v1/orders/o-1/cancel", Body: `{"reason": "r"}`},
			retry:      req{Path: "/v1/orders/o-1/cancel", Body: `{"reason": "r"}`},
			wantStatus: http.StatusOK, wantAnswer: commandAnswer{OrderID: "o-1", Version: 2, Status: "canceled"},
		},
		{
			name:       "reused for another place",
			first:      req{Path: "/v1/orders", Body: placeBody("")},
			retry:      req{Path: "/v1/orders", Body: placeBodyWith("", `"customer_id": "c-2", "currency": "BRL", "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 1}]`)},
			wantStatus: http.StatusUnprocessableEntity, wantProblem: "/problems/idempotency-key-reused",
		},
		{
			name:       "reused for another command",
			first:      req{Path: "/v1/orders/o-1/approve"},
			retry:      req{Path: "/v1/orders/o-1/cancel"},
			wantStatus: http.StatusUnprocessableEntity, wantProblem: "/problems/idempotency-key-reused",
		},
		{
			name:       "reused with another reason",
			first:      req{Path: "/v1/orders/o-1/cancel", Body: `{"reason": "a"}`},
			retry:      req{Path: "/v1/orders/o-1/cancel", Body: `{"reason": "b"}`},
			wantStatus: http.StatusUnprocessableEntity, wantProblem: "/problems/idempotency-key-reused",
		},
		{
			name:       "place key reused for a lifecycle command of the order it placed",
			first:      req{Path: "/v1/orders", Body: placeBody("")},
			retry:      req{Path: "/v1/orders/" + domain.KeyedOrderID("key-1") + "/approve"},
			wantStatus: http.StatusUnprocessableEntity, wantProblem: "/problems/idempotency-key-reused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			e.place(t, "o-2")
			first := e.post(t, tt.first.Path, tt.first.Body, "Idempotency-Key", "key-1")
			if first.Code/100 != 2 {
				t.Fatalf("first request: %d %s", first.Code, first.Body)
			}
			for _, b := range tt.between {
				if rec := e.post(t, b.Path, b.Body); rec.Code/100 != 2 {
					t.Fatalf("%s: %d %s", b.Path, rec.Code, rec.Body)
				}
			}
			commits := e.store.Commits()
			rec := e.post(t, tt.retry.Path, tt.retry.Body, "Idempotency-Key", "key-1")
			if tt.wantProblem != "" {
				wantProblem(t, rec, tt.wantStatus, tt.wantProblem)
			} else {
				if tt.wantAnswer.OrderID == "" {
					var f commandAnswer
					_ = json.Unmarshal(first.Body.Bytes(), &f)
					tt.wantAnswer.OrderID = f.OrderID
				}
				wantCommand(t, rec, tt.wantStatus, tt.wantAnswer, true)
				if loc := first.Header().Get("Location"); loc != rec.Header().Get("Location") {
					t.Errorf("Location %q, first answer had %q", rec.Header().Get("Location"), loc)
				}
			}
			if n := e.store.Commits(); n != commits {
				t.Errorf("the retry appended: %d commits, want %d", n, commits)
			}
		})
	}
}

// TestIfMatch: one rule, RFC 9110's (§13.1.1, entity tags §8.8.3): the
// order at v2 matches "*", its strong ETag "2" alone or in a list; a
// weak tag, a stale, future or other tag matches nothing and is 412; a
// value that is not "*" or a list of entity tags is 422 with a detail
// that says what is wrong. Neither appends anything.
func TestIfMatch(t *testing.T) {
	tests := []struct {
		name    string
		ifMatch []string // one header line each
		status  int
		problem string
		detail  string // in the detail of the 422's If-Match
	}{
		{name: "current", ifMatch: []string{`"2"`}, status: http.StatusOK},
		{name: "star", ifMatch: []string{`*`}, status: http.StatusOK},
		{name: "star in white space", ifMatch: []string{` * `}, status: http.StatusOK},
		{name: "list with the current", ifMatch: []string{`"1", "2"`}, status: http.StatusOK},
		{name: "list without spaces", ifMatch: []string{`"7","2"`}, status: http.StatusOK},
		{name: "list with empty elements", ifMatch: []string{`, "1" ,, "2",`}, status: http.StatusOK},
		{name: "list over two lines", ifMatch: []string{`"1"`, `"2"`}, status: http.StatusOK},
		{name: "list with the current weak and strong", ifMatch: []string{`W/"2", "2"`}, status: http.StatusOK},
		// If-Match compares strong tags only (§13.1.1): a weak tag
		// matches no version, not even the current one.
		{name: "current, weak", ifMatch: []string{`W/"2"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "stale, weak", ifMatch: []string{`W/"1"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "weak, not a version", ifMatch: []string{`W/"abc"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "stale", ifMatch: []string{`"1"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "ahead", ifMatch: []string{`"3"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "list without the current", ifMatch: []string{`"1", "3"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "zero", ifMatch: []string{`"0"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		// Well-formed entity tags that no version has: the strong
		// comparison is of the opaque strings, "02" is not "2".
		{name: "not a version", ifMatch: []string{`"abc"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "leading zero", ifMatch: []string{`"02"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "negative", ifMatch: []string{`"-1"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "overflow", ifMatch: []string{`"9223372036854775808"`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "empty tag", ifMatch: []string{`""`}, status: http.StatusPreconditionFailed, problem: "/problems/precondition-failed"},
		{name: "unquoted", ifMatch: []string{`2`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: `2 is not an entity tag: an entity tag is quoted, as in "2"`},
		{name: "unquoted in a list", ifMatch: []string{`"1", 2`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: `as in "2"`},
		{name: "weak, unquoted", ifMatch: []string{`W/2`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "not an entity tag"},
		{name: "weak in lower case", ifMatch: []string{`w/"2"`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "not an entity tag"},
		{name: "unterminated", ifMatch: []string{`"2`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "closing quote"},
		{name: "no comma", ifMatch: []string{`"1" "2"`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "separated by commas"},
		{name: "star in a list", ifMatch: []string{`*, "2"`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "* stands alone"},
		{name: "star and a tag on two lines", ifMatch: []string{`"2"`, `*`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "* stands alone"},
		{name: "space in a tag", ifMatch: []string{`"2 "`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "not allowed"},
		{name: "empty", ifMatch: []string{``}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "no entity tag"},
		{name: "commas only", ifMatch: []string{`, ,`}, status: http.StatusUnprocessableEntity, problem: "/problems/validation", detail: "no entity tag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			e.run(t, "o-1", "approve")
			hr := httptest.NewRequest(http.MethodPost, "/v1/orders/o-1/invoice", nil)
			hr.Header["If-Match"] = tt.ifMatch
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, hr)
			if tt.problem == "" {
				wantCommand(t, rec, tt.status, commandAnswer{OrderID: "o-1", Version: 3, Status: "invoiced"}, false)
				return
			}
			if tt.detail != "" {
				p := wantProblem(t, rec, tt.status, tt.problem, "If-Match")
				if d := fieldDetail(p, "If-Match"); !strings.Contains(d, tt.detail) {
					t.Errorf("If-Match's detail %q does not say %q", d, tt.detail)
				}
			} else {
				wantProblem(t, rec, tt.status, tt.problem)
			}
			if n := e.store.Commits(); n != 2 {
				t.Errorf("store holds %d commits, want 2", n)
			}
		})
	}
}

// TestIfMatchNoOrder: no If-Match holds for an order that does not
// exist, "*" included: 412, where the same command without it is 404.
func TestIfMatchNoOrder(t *testing.T) {
	e := newEnv(t)
	for _, m := range []string{`*`, `"1"`} {
		wantProblem(t, e.post(t, "/v1/orders/o-9/approve", "", "If-Match", m), http.StatusPreconditionFailed, "/problems/precondition-failed")
	}
	wantProblem(t, e.post(t, "/v1/orders/o-9/approve", ""), http.StatusNotFound, "/problems/not-found")
	if n := e.store.Commits(); n != 0 {
		t.Errorf("store holds %d commits, want 0", n)
	}
}

func TestCommandRefused(t *testing.T) {
	tests := []struct {
		name    string
		before  []string
		path    string
		body    string
		header  []string
		status  int
		problem string
	}{
		{name: "deliver created", path: "/v1/orders/o-1/deliver", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "invoice created", path: "/v1/orders/o-1/invoice", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "approve twice", before: []string{"approve"}, path: "/v1/orders/o-1/approve", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "cancel delivered", before: []string{"approve", "ship", "deliver"}, path: "/v1/orders/o-1/cancel", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "mark shipped unavailable", before: []string{"approve", "ship"}, path: "/v1/orders/o-1/mark-unavailable", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "approve canceled", before: []string{"cancel"}, path: "/v1/orders/o-1/approve", status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "illegal with a fresh key", path: "/v1/orders/o-1/deliver", header: []string{"Idempotency-Key", "fresh"}, status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "illegal with If-Match current", path: "/v1/orders/o-1/deliver", header: []string{"If-Match", `"1"`}, status: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "unknown order", path: "/v1/orders/nope/approve", status: http.StatusNotFound, problem: "/problems/not-found"},
		{name: "unknown order, cancel with body", path: "/v1/orders/nope/cancel", body: `{"reason": "x"}`, status: http.StatusNotFound, problem: "/problems/not-found"},
		{name: "unknown order with a key", path: "/v1/orders/nope/ship", header: []string{"Idempotency-Key", "k"}, status: http.StatusNotFound, problem: "/problems/not-found"},
		{name: "unknown command", path: "/v1/orders/o-1/refund", status: http.StatusNotFound, problem: "/problems/route"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			e.run(t, "o-1", tt.before...)
			commits := e.store.Commits()
			rec := e.post(t, tt.path, tt.body, tt.header...)
			wantProblem(t, rec, tt.status, tt.problem)
			if n := e.store.Commits(); n != commits {
				t.Errorf("store holds %d commits, want %d", n, commits)
			}
		})
	}
}

// TestPlaceWithKeyGetsKeyedID: a place without order_id but with an
// Idempotency-Key gets the order id KeyedOrderID(key), so a retry after a
// lost answer lands on the same order and gets the first answer.
func TestPlaceWithKeyGetsKeyedID(t *testing.T) {
	e := newEnv(t)
	id := domain.KeyedOrderID("place-key")
	first := e.post(t, "/v1/orders", placeBody(""), "Idempotency-Key", "place-key")
	wantCommand(t, first, http.StatusCreated, commandAnswer{OrderID: id, Version: 1, Status: "created"}, false)
	if loc := first.Header().Get("Location"); loc != "/v1/orders/"+id {
		t.Errorf("Location = %q, want /v1/orders/%s", loc, id)
	}
	retry := e.post(t, "/v1/orders", placeBody(""), "Idempotency-Key", "place-key")
	wantCommand(t, retry, http.StatusCreated, commandAnswer{OrderID: id, Version: 1, Status: "created"}, true)
	if e.store.Streams() != 1 || e.store.Commits() != 1 {
		t.Errorf("%d streams, %d commits; want 1 and 1", e.store.Streams(), e.store.Commits())
	}
}

// TestIdempotencyKeyPerOrder: a key belongs to the order it was used on;
// the same key on another order is another request, decided there.
func TestIdempotencyKeyPerOrder(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-1")
	e.place(t, "o-2")
	rec := e.post(t, "/v1/orders/o-1/approve", "", "Idempotency-Key", "key-1")
	wantCommand(t, rec, http.StatusOK, commandAnswer{OrderID: "o-1", Version: 2, Status: "approved"}, false)
	rec = e.post(t, "/v1/orders/o-2/approve", "", "Idempotency-Key", "key-1")
	wantCommand(t, rec, http.StatusOK, commandAnswer{OrderID: "o-2", Version: 2, Status: "approved"}, false)

	rec = e.post(t, "/v1/orders", placeBody("o-7"), "Idempotency-Key", "key-2")
	wantCommand(t, rec, http.StatusCreated, commandAnswer{OrderID: "o-7", Version: 1, Status: "created"}, false)
	rec = e.post(t, "/v1/orders", placeBody("o-8"), "Idempotency-Key", "key-2")
	wantCommand(t, rec, http.StatusCreated, commandAnswer{OrderID: "o-8", Version: 1, Status: "created"}, false)
}
