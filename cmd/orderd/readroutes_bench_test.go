package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// Sizes of BenchmarkReadRoutes.
const (
	readRoutesEvents = 110_000          // the log holds at least this many events: 7 copies of the Olist sample
	readRoutesSeed   = 20_171_102       // picks the customers read
	readRoutesStatus = "delivered"      // the status of the status-only pages
	readRoutesLimit  = 30 * time.Minute // the whole run, load included
)

// readRoutesReads is how many times each route is read.
var readRoutesReads = flag.Int("readroutes.reads", 200, "BenchmarkReadRoutes: reads of each route (and raw look-ups)")

// readRoute is a read the benchmark times: the path of its i-th read and
// the status it must answer.
type readRoute struct {
	name string
	path func(i int) string
	want int
}

// BenchmarkReadRoutes measures the REST reads of the read model against
// the store's raw look-up, on its own embedded Main (every role) whose
// read model holds the 28,497 summaries of a log of 113,211 events:
//
//  1. setup, not timed: copy 0 of the Olist sample (4,071 orders) runs
//     through domain.Service, copies 1 to 6 are copy 0's commits inserted
//     into the log in bulk (see loadOlistCopies), and the service's relay
//     and projector bring order_summaries up to the log; the benchmark
//     waits until /metrics counts every event applied. An Olist customer
//     has one order, so each customer has 7, one per copy.
//  2. one client reads each route -readroutes.reads times (default 200),
//     one read after another, each time of another customer picked at
//     random from the sample: the customer's stats, the customer's first
//     page of summaries (50), the stats of a customer with no order (404),
//     and the first page of the summaries of one status; then the store's
//     raw limit, a FindOne({_id: v}) of a random summary through the
//     driver.
//
// It prints each read's p50 and p99 and their ratio to the raw look-up's,
// and reports them with b.ReportMetric. Run it with -benchtime 1x (make
// bench); it does its fixed work once whatever b.N is.
func BenchmarkReadRoutes(b *testing.B) {
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), readRoutesLimit)
	defer cancel()
	loadStart := loadAverage()
	m := runMainDir(b, b.TempDir())
	db := m.mongo.Database(m.Config.Mongo.Database)
	base := "http://" + m.HTTPAddr
	hc := &http.Client{Timeout: time.Minute}

	loaded := loadOlistCopies(ctx, b, db, mongodb.NewEventStore(db), readRoutesEvents, 1)
	fmt.Fprintf(os.Stderr, "BenchmarkReadRoutes: appended %d events of %d orders in %v; projecting\n",
		loaded.events, loaded.orders, (loaded.elapsed + loaded.bulkElapsed).Round(time.Second))
	projected := time.Now()
	const applied = `orderd_projection_events_applied_total{projection="order_summaries"}`
	if !waitFor(15*time.Minute, time.Second, func() bool { return scrapeMetrics(ctx, hc, base)[applied] >= float64(loaded.events) }) {
		b.Fatalf("order_summaries applied %.0f of %d events after 15 minutes", scrapeMetrics(ctx, hc, base)[applied], loaded.events)
	}
	fmt.Fprintf(os.Stderr, "BenchmarkReadRoutes: projected in %v\n", time.Since(projected).Round(time.Second))

	ds, err := olist.Load(rebuildSample)
	if err != nil {
		b.Fatalf("load the Olist sample: %v", err)
	}
	copies := loaded.orders / len(ds.Orders)
	r := rand.New(rand.NewPCG(readRoutesSeed, 1))
	n := *readRoutesReads
	customers, orders := make([]string, n), make([]string, n)
	for i := range n {
		customers[i] = ds.Orders[r.IntN(len(ds.Orders))].CustomerID
		orders[i] = fmt.Sprintf("c%d-%s", r.IntN(copies), ds.Orders[r.IntN(len(ds.Orders))].ID)
	}
	routes := []readRoute{
		{"customer stats", func(i int) string { return "/v1/customers/" + customers[i] + "/order-stats" }, http.StatusOK},
		{"a customer's first page of summaries", func(i int) string { return "/v1/order-summaries?customer_id=" + customers[i] }, http.StatusOK},
		{"stats of an unknown customer (404)", func(i int) string { return fmt.Sprintf("/v1/customers/no-such-customer-%d/order-stats", i) }, http.StatusNotFound},
		{"a status's first page of summaries", func(int) string { return "/v1/order-summaries?status=" + readRoutesStatus }, http.StatusOK},
		// The daily-sales rollup's reads go here, once it serves
		// GET /v1/daily-sales: a month's, a year's and ten years' daily
		// sales.
	}

	b.StartTimer()
	times := make([][]time.Duration, len(routes))
	for k, rt := range routes {
		times[k] = make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			code, body := getBody(ctx, b, hc, base+rt.path(i))
			times[k][i] = time.Since(start)
			if code != rt.want {
				b.Fatalf("GET %s: %d %s, want %d", rt.path(i), code, body, rt.want)
			}
			if k == 0 {
				var st struct {
					OrderCount int64 `json:"order_count"`
				}
				if err := json.Unmarshal(body, &st); err != nil || st.OrderCount != int64(copies) {
					b.Fatalf("GET %s: %s, want %d orders (%v)", rt.path(i), body, copies, err)
				}
			}
		}
		fmt.Fprintf(os.Stderr, "BenchmarkReadRoutes: %s: p50 %v\n", rt.name, percentile(times[k], 50))
	}
	summaries := db.Collection(projection.OrderSummaries.Collection)
	raw := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		err := summaries.FindOne(ctx, bson.D{{Key: "_id", Value: orders[i]}}).Err()
		raw[i] = time.Since(start)
		if err != nil {
			b.Fatalf("raw look-up of %s: %v", orders[i], err)
		}
	}
	b.StopTimer()

	rawP50, rawP99 := percentile(raw, 50), percentile(raw, 99)
	var t strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&t, format, args...) }
	f("\nBenchmarkReadRoutes: embedded FerretDB 1.24 on SQLite, one client, %d reads of each\n", n)
	f("  read model: order_summaries of %d orders (%d events); %d orders per customer\n", loaded.orders, loaded.events, copies)
	f("  %-46s %12s %12s %10s %10s\n", "read", "p50", "p99", "p50/raw", "p99/raw")
	f("  %-46s %12s %12s %10s %10s\n", "raw FindOne({_id: v}) of a summary", round(rawP50), round(rawP99), "1", "1")
	b.ReportMetric(ms(rawP50), "raw_p50_ms")
	b.ReportMetric(ms(rawP99), "raw_p99_ms")
	for k, rt := range routes {
		p50, p99 := percentile(times[k], 50), percentile(times[k], 99)
		f("  %-46s %12s %12s %10.1f %10.1f\n", "GET "+rt.name, round(p50), round(p99), float64(p50)/float64(rawP50), float64(p99)/float64(rawP99))
		metric := strings.NewReplacer(" ", "_", "'", "", "(", "", ")", "").Replace(rt.name)
		b.ReportMetric(ms(p50), metric+"_p50_ms")
		b.ReportMetric(ms(p99), metric+"_p99_ms")
	}
	f("  load average (shared machine, %d CPUs) %s at the start, %s at the end\n", runtime.NumCPU(), loadStart, loadAverage())
	fmt.Fprint(os.Stdout, t.String())
	b.ReportMetric(0, "ns/op")
}

// getBody sends GET url and returns the answer's status and body.
func getBody(ctx context.Context, b *testing.B, hc *http.Client, url string) (int, []byte) {
	b.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}
