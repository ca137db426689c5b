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
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// Sizes of BenchmarkReadRoutes.
const (
	readRoutesSeed   = 20_171_102       // picks the customers and months read
	readRoutesStatus = "delivered"      // the status of the status-only pages
	readRoutesLimit  = 30 * time.Minute // the whole run at 110,000 events, load included; longer in proportion
)

var (
	// readRoutesReads is how many times each route is read.
	readRoutesReads = flag.Int("readroutes.reads", 200, "BenchmarkReadRoutes: reads of each route (and raw look-ups)")
	// readRoutesEvents is the least the log holds: 110,000 events are 7
	// copies of the Olist sample (make bench-1m: 1,000,000).
	readRoutesEvents = flag.Int("readroutes.events", 110_000, "BenchmarkReadRoutes: events in the log, at least")
)

// readRoute is a read the benchmark times: the path of its i-th read and
// the status it must answer.
type readRoute struct {
	name string
	path func(i int) string
	want int
}

// BenchmarkReadRoutes measures the REST reads of the read models against
// the store's raw look-up, on its own embedded Main (every role) whose
// read models hold a log of at least -readroutes.events events (default
// 110,000: the 28,497 summaries of 113,211 events):
//
//  1. setup, not timed: copy 0 of the Olist sample (4,071 orders) runs
//     through domain.Service, the further copies are copy 0's commits
//     inserted into the log in bulk (see loadOlistCopies), and the
//     service's relay and projectors bring order_summaries and the
//     daily_sales rollup up to the log; the benchmark waits until
//     /metrics counts every event applied to the summaries and the
//     rollup's lag is 0. An Olist customer has one order, so each
//     customer has one per copy, in copies 0 to 6; further copies place
//     their orders for other customers (bulkCopies), so that a customer
//     has 7 orders however long the log.
//  2. one client reads each route -readroutes.reads times (default 200),
//     one read after another, each time of another customer or month
//     picked at random from the sample: the customer's stats, the
//     customer's first page of summaries (50), the stats of a customer
//     with no order (404), the first page of the summaries of one status,
//     a month's daily sales, a year's (2017) and ten years' (2016-2025,
//     whose orders placed must be every order of the log); then the
//     store's raw limit, a FindOne({_id: v}) of a random summary through
//     the driver.
//
// It prints each read's p50 and p99 and their ratio to the raw look-up's,
// and reports them with b.ReportMetric. Run it with -benchtime 1x (make
// bench, and make bench-1m at 1,000,000 events); it does its fixed work
// once whatever b.N is.
func BenchmarkReadRoutes(b *testing.B) {
	b.StopTimer()
	limit := readRoutesLimit * time.Duration(max(1, *readRoutesEvents/110_000))
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	loadStart := loadAverage()
	m := runMainDir(b, b.TempDir(), func(c *Config) { c.HTTP.AdminToken = testAdminToken })
	db := m.mongo.Database(m.Config.Mongo.Database)
	base := "http://" + m.HTTPAddr
	hc := &http.Client{Timeout: time.Minute}

	loaded := loadOlistCopies(ctx, b, db, mongodb.NewEventStore(db), *readRoutesEvents, 1)
	fmt.Fprintf(os.Stderr, "BenchmarkReadRoutes: appended %d events of %d orders in %v; projecting\n",
		loaded.events, loaded.orders, (loaded.elapsed + loaded.bulkElapsed).Round(time.Second))
	projected := time.Now()
	const applied = `orderd_projection_events_applied_total{projection="order_summaries"}`
	if !waitFor(limit/2, time.Second, func() bool { return scrapeMetrics(ctx, hc, base)[applied] >= float64(loaded.events) }) {
		b.Fatalf("order_summaries applied %.0f of %d events after %v", scrapeMetrics(ctx, hc, base)[applied], loaded.events, limit/2)
	}
	// The daily sales rollup, fed by the same stream in one partition.
	if !waitFor(limit/4, time.Second, func() bool { lag, ok := activeLag(ctx, b, hc, base, projection.DailySales.Name); return ok && lag == 0 }) {
		b.Fatalf("daily_sales still behind after %v", limit/4)
	}
	fmt.Fprintf(os.Stderr, "BenchmarkReadRoutes: projected in %v\n", time.Since(projected).Round(time.Second))

	ds, err := olist.Load(rebuildSample)
	if err != nil {
		b.Fatalf("load the Olist sample: %v", err)
	}
	allCopies := loaded.orders / len(ds.Orders)
	copies := min(allCopies, customerCopies) // orders per customer
	r := rand.New(rand.NewPCG(readRoutesSeed, 1))
	n := *readRoutesReads
	customers, orders := make([]string, n), make([]string, n)
	// The sample's orders were placed from September 2016 to October
	// 2018: a month of those 26.
	months := make([]time.Time, n)
	for i := range n {
		months[i] = time.Date(2016, time.Month(9+r.IntN(26)), 1, 0, 0, 0, 0, time.UTC)
		customers[i] = ds.Orders[r.IntN(len(ds.Orders))].CustomerID
		orders[i] = fmt.Sprintf("c%d-%s", r.IntN(allCopies), ds.Orders[r.IntN(len(ds.Orders))].ID)
	}
	routes := []readRoute{
		{"customer stats", func(i int) string { return "/v1/customers/" + customers[i] + "/order-stats" }, http.StatusOK},
		{"a customer's first page of summaries", func(i int) string { return "/v1/order-summaries?customer_id=" + customers[i] }, http.StatusOK},
		{"stats of an unknown customer (404)", func(i int) string { return fmt.Sprintf("/v1/customers/no-such-customer-%d/order-stats", i) }, http.StatusNotFound},
		{"a status's first page of summaries", func(int) string { return "/v1/order-summaries?status=" + readRoutesStatus }, http.StatusOK},
		{"a month's daily sales", func(i int) string {
			m := months[i]
			return fmt.Sprintf("/v1/daily-sales?from=%s&to=%s", m.Format(time.DateOnly), m.AddDate(0, 1, -1).Format(time.DateOnly))
		}, http.StatusOK},
		{"a year's daily sales", func(int) string { return "/v1/daily-sales?from=2017-01-01&to=2017-12-31" }, http.StatusOK},
		{"ten years' daily sales", func(int) string { return "/v1/daily-sales?from=2016-01-01&to=2025-12-31" }, http.StatusOK},
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
			switch rt.name {
			case "customer stats":
				var st struct {
					OrderCount int64 `json:"order_count"`
				}
				if err := json.Unmarshal(body, &st); err != nil || st.OrderCount != int64(copies) {
					b.Fatalf("GET %s: %s, want %d orders (%v)", rt.path(i), body, copies, err)
				}
			case "ten years' daily sales":
				var rep orderhttp.DailySalesReport
				placed := int64(0)
				if err := json.Unmarshal(body, &rep); err == nil {
					for _, d := range rep.Days {
						placed += d.OrdersPlaced
					}
				}
				if placed != int64(loaded.orders) {
					b.Fatalf("GET %s: %d orders placed, want %d", rt.path(i), placed, loaded.orders)
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

// activeLag is the lag of what readers read of projection name, from the
// admin API; false when it has no sample.
func activeLag(ctx context.Context, b *testing.B, hc *http.Client, base, name string) (uint64, bool) {
	b.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/admin/projections", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var body struct {
		Projections []struct {
			Name      string  `json:"name"`
			ActiveLag *uint64 `json:"active_lag"`
		} `json:"projections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, false
	}
	for _, p := range body.Projections {
		if p.Name == name && p.ActiveLag != nil {
			return *p.ActiveLag, true
		}
	}
	return 0, false
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
