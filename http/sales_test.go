package http_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

var salesRows = []domain.DailySales{
	{Day: "2017-10-02", Currency: "BRL", OrdersPlaced: 3, Items: 5, GrossCents: 12990, FreightCents: 1530, OrdersCanceled: 1},
	{Day: "2017-10-02", Currency: "EUR", OrdersPlaced: 1, Items: 1, GrossCents: 500, FreightCents: 0, OrdersUnavailable: 1},
	{Day: "2017-10-04", Currency: "BRL", OrdersPlaced: 2, Items: 2, GrossCents: 800, FreightCents: 90},
}

// GET /v1/daily-sales answers the range asked for and the read model's
// rows in it, with every field, "days": [] for a range without orders.
func TestDailySales(t *testing.T) {
	e := newEnv(t)
	e.reads.sales = salesRows
	for _, tc := range []struct {
		query string
		want  string
		asked []string // from, to, currency the read model was asked for
	}{
		{"?from=2017-10-01&to=2017-10-31", `{"from":"2017-10-01","to":"2017-10-31","days":[` +
			`{"day":"2017-10-02","currency":"BRL","orders_placed":3,"items":5,"gross_cents":12990,"freight_cents":1530,"orders_canceled":1,"orders_unavailable":0},` +
			`{"day":"2017-10-02","currency":"EUR","orders_placed":1,"items":1,"gross_cents":500,"freight_cents":0,"orders_canceled":0,"orders_unavailable":1},` +
			`{"day":"2017-10-04","currency":"BRL","orders_placed":2,"items":2,"gross_cents":800,"freight_cents":90,"orders_canceled":0,"orders_unavailable":0}]}`,
			[]string{"2017-10-01", "2017-10-31", ""}},
		{"?from=2017-10-04&to=2017-10-04&currency=BRL", `{"from":"2017-10-04","to":"2017-10-04","days":[` +
			`{"day":"2017-10-04","currency":"BRL","orders_placed":2,"items":2,"gross_cents":800,"freight_cents":90,"orders_canceled":0,"orders_unavailable":0}]}`,
			[]string{"2017-10-04", "2017-10-04", "BRL"}},
		{"?from=2017-10-03&to=2017-10-03", `{"from":"2017-10-03","to":"2017-10-03","days":[]}`, []string{"2017-10-03", "2017-10-03", ""}},
		// Ten years, both ends included: the longest range.
		{"?to=2025-12-31&from=2016-01-01&currency=USD", `{"from":"2016-01-01","to":"2025-12-31","days":[]}`, []string{"2016-01-01", "2025-12-31", "USD"}},
	} {
		t.Run(tc.query, func(t *testing.T) {
			e.reads.salesAsks = nil
			rec := e.get(t, "/v1/daily-sales"+tc.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			wantJSON(t, rec)
			var got, want any
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal([]byte(tc.want), &want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("body\n got %s\nwant %s", rec.Body, tc.want)
			}
			if len(e.reads.salesAsks) != 1 {
				t.Fatalf("the read model was asked %d times, want once", len(e.reads.salesAsks))
			}
			a := e.reads.salesAsks[0]
			if got := []string{a.from.Format(time.DateOnly), a.to.Format(time.DateOnly), a.currency}; !reflect.DeepEqual(got, tc.asked) {
				t.Errorf("the read model was asked for %v, want %v", got, tc.asked)
			}
		})
	}

	e.reads.err = domain.ErrUnavailable
	wantProblem(t, e.get(t, "/v1/daily-sales?from=2017-10-01&to=2017-10-31"), http.StatusServiceUnavailable, "/problems/unavailable")
}

// Every invalid parameter of GET /v1/daily-sales is listed in a 422, and
// the read model is not asked.
func TestDailySalesInvalidQuery(t *testing.T) {
	tests := []struct {
		query  string
		fields []string
	}{
		{"", []string{"from", "to"}},
		{"?from=2017-10-01", []string{"to"}},
		{"?to=2017-10-01", []string{"from"}},
		{"?from=&to=", []string{"from", "to"}},
		{"?from=2017-10-1&to=2017-10-31", []string{"from"}},
		{"?from=2017-10-01&to=2017-13-01", []string{"to"}},
		{"?from=2017-02-30&to=2017-03-01", []string{"from"}},
		{"?from=20171001&to=2017-10-31", []string{"from"}},
		{"?from=2017-10-01T00:00:00Z&to=2017-10-31", []string{"from"}},
		{"?from=2017-10-01&to=2017-10-31+", []string{"to"}},
		{"?from=-2017-10-01&to=2017-10-31", []string{"from"}},
		{"?from=2017-10-02&to=2017-10-01", []string{"to"}}, // inverted
		{"?from=2016-01-01&to=2026-01-01", []string{"to"}}, // ten years and a day
		{"?from=0001-01-01&to=9999-12-31", []string{"to"}}, // far too long
		{"?from=2017-10-01&to=2017-10-31&currency=brl", []string{"currency"}},
		{"?from=2017-10-01&to=2017-10-31&currency=BR", []string{"currency"}},
		{"?from=2017-10-01&to=2017-10-31&currency=BRLX", []string{"currency"}},
		{"?from=2017-10-01&to=2017-10-31&currency=%24ne", []string{"currency"}},
		{"?from=x&to=2017-10-01&currency=1", []string{"from", "currency"}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			e := newEnv(t)
			p := wantProblem(t, e.get(t, "/v1/daily-sales"+tt.query), http.StatusUnprocessableEntity, "/problems/validation", tt.fields...)
			if len(p.Errors) != len(tt.fields) {
				t.Errorf("errors %+v, want exactly %v", p.Errors, tt.fields)
			}
			if len(e.reads.salesAsks) != 0 {
				t.Errorf("the read model was asked: %+v", e.reads.salesAsks)
			}
		})
	}
}

// The client sends the range as UTC dates and decodes the report; an
// invalid range comes back as an *Error wrapping domain.ErrValidation.
func TestClientDailySales(t *testing.T) {
	e := newEnv(t)
	e.reads.sales = salesRows
	c := serve(t, e.h, "")
	// 23:00 at UTC-3 on October 3 is October 4 in UTC.
	brt := time.FixedZone("BRT", -3*3600)
	got, err := c.DailySales(t.Context(), time.Date(2017, 10, 2, 12, 0, 0, 0, time.UTC), time.Date(2017, 10, 3, 23, 0, 0, 0, brt), "BRL")
	if err != nil {
		t.Fatal(err)
	}
	want := orderhttp.DailySalesReport{From: "2017-10-02", To: "2017-10-04", Days: []domain.DailySales{salesRows[0], salesRows[2]}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report %+v, want %+v", got, want)
	}
	_, err = c.DailySales(t.Context(), time.Date(2017, 10, 2, 0, 0, 0, 0, time.UTC), time.Date(2017, 10, 1, 0, 0, 0, 0, time.UTC), "")
	wantError(t, err, http.StatusUnprocessableEntity, "validation", domain.ErrValidation)
}

// FuzzDailySalesQuery sends arbitrary from, to and currency parameters:
// the answer is 200 only for a valid range, whose bounds the read model
// is asked for, and otherwise a 422 problem that asks the read model
// nothing.
func FuzzDailySalesQuery(f *testing.F) {
	for _, s := range [][3]string{{"2017-10-01", "2017-10-31", ""}, {"2016-01-01", "2016-12-31", "BRL"}, {"2017-10-02", "2017-10-01", "EUR"},
		{"2017-02-29", "2017-03-01", ""}, {"0000-01-01", "0000-12-31", "brl"}, {"2017-10-01T00:00:00Z", "", "$ne"}} {
		f.Add(s[0], s[1], s[2])
	}
	e := newEnv(f)
	f.Fuzz(func(t *testing.T, from, to, currency string) {
		e.reads.salesAsks = nil
		q := url.Values{"from": {from}, "to": {to}, "currency": {currency}}
		rec := e.get(t, "/v1/daily-sales?"+q.Encode())
		if rec.Code != http.StatusOK {
			wantProblem(t, rec, http.StatusUnprocessableEntity, "/problems/validation")
			if len(e.reads.salesAsks) != 0 {
				t.Errorf("%s: a refused query asked the read model %+v", q.Encode(), e.reads.salesAsks)
			}
			return
		}
		if len(e.reads.salesAsks) != 1 {
			t.Fatalf("%s: answered 200 after %d read model calls", q.Encode(), len(e.reads.salesAsks))
		}
		a := e.reads.salesAsks[0]
		if a.from.Format(time.DateOnly) != from || a.to.Format(time.DateOnly) != to || a.to.Before(a.from) ||
			!a.to.Before(a.from.AddDate(10, 0, 0)) || a.currency != currency {
			t.Errorf("%s: the read model was asked for %+v", q.Encode(), a)
		}
	})
}
