package http_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Seeds beyond those in testdata/fuzz: the shapes the hostile tests use.
var placeSeeds = []string{
	placeBody("o-2"),
	placeBody(""),
	withCustomer(`{"$gt": ""}`),
	withItem(`"sku": "s", "quantity": 9223372036854775808, "unit_price_cents": 1`),
	`{"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 1}], "at": "0000-01-01T00:00:00+01:00"}`,
	`[]`, `null`, `{}`, ``, " ", `{"customer_id"`,
}

var cancelSeeds = []string{
	`{"reason": "r"}`, `{}`, ``, `{"at": "2017-10-02T10:56:33Z", "reason": "late"}`,
	`{"reason": "` + strings.Repeat("é", 300) + `"}`, `{"at": "yesterday"}`, `null`, `[]`, `{"reason": 1e400}`,
}

// FuzzPlaceBody posts arbitrary bytes as the body of POST /v1/orders.
func FuzzPlaceBody(f *testing.F) {
	for _, s := range placeSeeds {
		f.Add([]byte(s))
	}
	e := newEnv(f) // one server per worker: inputs run one at a time
	f.Fuzz(func(t *testing.T, body []byte) {
		e.store.Reset()
		e.place(t, "o-1")
		rec := postBytes(e, "/v1/orders", body)
		checkAnswer(t, e, rec, body, 1)
		if rec.Code/100 == 2 && rec.Code != http.StatusCreated {
			t.Errorf("place answered %d, want 201 or a problem", rec.Code)
		}
	})
}

// FuzzLifecycleBody posts arbitrary bytes as the body of
// POST /v1/orders/{id}/cancel on an order that can be canceled.
func FuzzLifecycleBody(f *testing.F) {
	for _, s := range cancelSeeds {
		f.Add([]byte(s))
	}
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		e.store.Reset()
		e.place(t, "o-1")
		rec := postBytes(e, "/v1/orders/o-1/cancel", body)
		checkAnswer(t, e, rec, body, 1)
	})
}

// FuzzIfMatch sends arbitrary If-Match values with an approve of an order
// at v1: never a 5xx; a refusal is a problem document that appends
// nothing; the command runs only for "*" or a list holding the strong
// tag "1".
func FuzzIfMatch(f *testing.F) {
	for _, s := range []string{`"1"`, `*`, `W/"1"`, `"0", "1"`, `1`, `"1`, `*, "1"`, `, ,`, `"1" "2"`, `W/"1", "1"`} {
		f.Add(s)
	}
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, ifMatch string) {
		e.store.Reset()
		e.place(t, "o-1")
		hr := httptest.NewRequest(http.MethodPost, "/v1/orders/o-1/approve", nil)
		hr.Header.Set("If-Match", ifMatch)
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, hr)
		checkAnswer(t, e, rec, nil, 1)
		trimmed := strings.Trim(ifMatch, " \t")
		if rec.Code/100 == 2 && trimmed != "*" && !strings.HasPrefix(trimmed, `"1"`) && !strings.Contains(ifMatch, `,"1"`) &&
			!strings.Contains(ifMatch, ` "1"`) && !strings.Contains(ifMatch, "\t\"1\"") {
			t.Errorf("If-Match %q ran the command: %d %s", ifMatch, rec.Code, rec.Body)
		}
	})
}

func postBytes(e *env, path string, body []byte) *httptest.ResponseRecorder {
	hr := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, hr)
	return rec
}

// checkAnswer holds the properties of every answer to an arbitrary body:
// never a 5xx; a refusal is a problem document with a /problems/ type and
// appends nothing; success only for a body that is JSON (or, where a body
// is optional, no body at all).
func checkAnswer(t *testing.T, e *env, rec *httptest.ResponseRecorder, body []byte, commitsBefore int) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("body %q: %d %s", body, rec.Code, rec.Body)
	}
	if rec.Code/100 != 2 {
		readProblem(t, rec)
		if n := e.store.Commits(); n != commitsBefore {
			t.Errorf("body %q refused with %d, but the store holds %d commits, want %d", body, rec.Code, n, commitsBefore)
		}
		return
	}
	if json.Valid(body) || len(bytes.Trim(body, " \t\r\n")) == 0 {
		return
	}
	t.Errorf("body %q is not JSON, but the answer is %d %s", body, rec.Code, rec.Body)
}
