package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/orderd/orderd/cmd/orderd/olist"
)

var update = flag.Bool("update", false, "write testdata/olist-answers.json from this run")

// answersFile holds what GET /v1/customers/{id}/order-stats (recorded_at
// left out: it is when this run's store committed) and GET
// /v1/daily-sales (every currency, and each currency alone) answered
// after answersOrders Olist orders were imported, as recorded by
// `go test -run TestOlistAnswersAsRecorded -update ./cmd/orderd`.
const (
	answersFile   = "testdata/olist-answers.json"
	answersOrders = 60
)

type olistAnswers struct {
	Stats map[string]json.RawMessage `json:"stats"` // by customer id
	Sales map[string]json.RawMessage `json:"sales"` // by currency, "" for all
}

// TestOlistAnswersAsRecorded imports the oldest Olist orders and compares
// every customer's stats and the daily sales with the answers recorded in
// answersFile: how the read models are stored may change, what a reader
// gets may not.
func TestOlistAnswersAsRecorded(t *testing.T) {
	m := runMain(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep, err := olist.Run(ctx, olist.Config{Data: "../../testdata/olist-sample", URL: "http://" + m.HTTPAddr,
		Concurrency: 8, Limit: answersOrders, Timeout: 30 * time.Second})
	if err != nil || rep.Err() != nil || rep.Orders != answersOrders {
		t.Fatalf("import: %v %v, %d orders", err, rep.Err(), rep.Orders)
	}
	c := newClient(t, m)
	// The summaries say what every answer must count once the read
	// models have caught up.
	type summary struct {
		CustomerID string    `json:"customer_id"`
		Status     string    `json:"status"`
		Currency   string    `json:"currency"`
		PlacedAt   time.Time `json:"placed_at"`
	}
	var sums []summary
	for cursor := ""; ; {
		var page struct {
			Items      []summary `json:"items"`
			NextCursor string    `json:"next_cursor"`
		}
		c.must(http.StatusOK, "GET", "/v1/order-summaries?limit=500&cursor="+url.QueryEscape(cursor), "").decode(t, &page)
		sums = append(sums, page.Items...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(sums) != answersOrders {
		t.Fatalf("%d summaries, want %d", len(sums), answersOrders)
	}
	got := olistAnswers{Stats: map[string]json.RawMessage{}, Sales: map[string]json.RawMessage{}}
	perCustomer := map[string][]summary{}
	first, last := sums[0].PlacedAt, sums[0].PlacedAt
	currencies := map[string]bool{"": true}
	for _, s := range sums {
		perCustomer[s.CustomerID] = append(perCustomer[s.CustomerID], s)
		first, last = minTime(first, s.PlacedAt), maxTime(last, s.PlacedAt)
		currencies[s.Currency] = true
	}
	for id, orders := range perCustomer {
		st := c.waitStats(id, func(s customerStats) bool {
			n := map[string]int64{}
			for _, o := range orders {
				n[o.Status]++
			}
			for k, v := range s.ByStatus {
				if v != n[k] {
					return false
				}
			}
			return s.OrderCount == int64(len(orders))
		})
		got.Stats[id] = mustJSON(t, st)
	}
	for cur := range currencies {
		path := "/v1/daily-sales?from=" + first.UTC().Format(time.DateOnly) + "&to=" + last.UTC().Format(time.DateOnly)
		if cur != "" {
			path += "&currency=" + cur
		}
		want := 0
		for _, s := range sums {
			if cur == "" || s.Currency == cur {
				want++
			}
		}
		var r response
		if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
			r = c.must(http.StatusOK, "GET", path, "")
			var body struct {
				Days []struct {
					OrdersPlaced int `json:"orders_placed"`
				} `json:"days"`
			}
			r.decode(t, &body)
			n := 0
			for _, d := range body.Days {
				n += d.OrdersPlaced
			}
			return n == want
		}) {
			t.Fatalf("daily sales %s never counted %d orders: %v", path, want, r)
		}
		got.Sales[cur] = json.RawMessage(bytes.TrimSpace(r.Body))
	}
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(answersFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	raw, err := os.ReadFile(answersFile)
	if err != nil {
		t.Fatal(err)
	}
	var want olistAnswers
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	for _, k := range slices.Sorted(keys(want.Stats, got.Stats)) {
		if !jsonEqual(want.Stats[k], got.Stats[k]) {
			t.Errorf("customer %s stats:\n got %s\nwant %s", k, got.Stats[k], want.Stats[k])
		}
	}
	for _, k := range slices.Sorted(keys(want.Sales, got.Sales)) {
		if !jsonEqual(want.Sales[k], got.Sales[k]) {
			t.Errorf("daily sales (currency %q):\n got %s\nwant %s", k, got.Sales[k], want.Sales[k])
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// keys returns the keys of both maps.
func keys(a, b map[string]json.RawMessage) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range a {
			if !yield(k) {
				return
			}
		}
		for k := range b {
			if _, ok := a[k]; !ok && !yield(k) {
				return
			}
		}
	}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ea, _ := json.Marshal(va)
	eb, _ := json.Marshal(vb)
	return bytes.Equal(ea, eb)
}
