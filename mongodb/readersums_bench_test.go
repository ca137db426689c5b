package mongodb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// The size of the project's benchmark log: 7 copies of the 4,071 Olist
// sample orders, 28,497 order streams holding 113,211 events.
const (
	readerSumsSampleOrders = 4_071
	readerSumsCopies       = 7
	readerSumsEvents       = 113_211
	// Olist customers have about one order each: every customer gets one
	// order and the orders left over go to a few regular customers.
	readerSumsCustomers = 28_000
	readerSumsRegulars  = 100
	readerSumsBatch     = 500 // streams per Apply
	readerSumsSeed      = 20_171_001
)

// readerSumsFirstDay and readerSumsDays bound the orders' placement: about
// two years, as in the Olist data.
var (
	readerSumsFirstDay = time.Date(2016, 10, 1, 0, 0, 0, 0, time.UTC)
	readerSumsDays     = 730
)

// readerSumsCount is the count the environment variable name sets, def
// without it: on a loaded machine the embedded store's reads can take
// seconds each, and fewer reads still give the order of magnitude.
func readerSumsCount(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}

// readerSumsProgress writes a line to stderr at once: the benchmark's
// log shows only when it ends, and a run lasts minutes.
func readerSumsProgress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
}

// readerSumsNoLog is the event log of a read model fed every stream from
// its first version: it is never asked for a gap.
type readerSumsNoLog struct{}

func (readerSumsNoLog) LoadFrom(context.Context, string, int64) ([]domain.Event, error) {
	return nil, errors.New("the benchmark gives every stream from v1: no gap to read")
}

// readerSumsData is the generated log: the streams' events, in stream
// order, and each customer's order count.
type readerSumsData struct {
	streams   [][]domain.Event
	events    int
	customers []string
	orders    map[string]int64
}

// readerSumsHex is a 32-digit hex id, like Olist's.
func readerSumsHex(r *rand.Rand) string { return fmt.Sprintf("%016x%016x", r.Uint64(), r.Uint64()) }

// readerSumsGenerate builds the log in memory from a fixed seed, the same
// on every run and every version of the reader. Each order follows one of
// projectiontest.Lifecycle's seven paths (1 to 6 events); a fixed share
// of the placed-only orders go the full way, and one shipped order is
// canceled at the door, so that the log holds readerSumsEvents events.
func readerSumsGenerate(n int) readerSumsData {
	r := rand.New(rand.NewPCG(readerSumsSeed, readerSumsSeed))
	d := readerSumsData{orders: map[string]int64{}}
	for range readerSumsCustomers {
		d.customers = append(d.customers, readerSumsHex(r))
	}
	recorded := time.Date(2026, 1, 5, 8, 0, 0, 0, time.UTC)
	fullWay, atTheDoor := 0, 0
	for i := range n {
		path := i % 7
		if path == 5 && fullWay < 2_287 {
			path, fullWay = 0, fullWay+1
		} else if path == 1 && atTheDoor < 1 {
			path, atTheDoor = 4, atTheDoor+1
		}
		customer := d.customers[i%readerSumsCustomers]
		if i >= readerSumsCustomers {
			customer = d.customers[r.IntN(readerSumsRegulars)]
		}
		d.orders[customer]++
		id := readerSumsHex(r)
		placed := readerSumsFirstDay.Add(time.Duration(r.Int64N(int64(readerSumsDays) * int64(24*time.Hour))))
		datas := projectiontest.Lifecycle(i-i%7+path, customer)
		evs := make([]domain.Event, len(datas))
		for v, data := range datas {
			e := projectiontest.NewEvent(id, int64(v+1), data, placed.Add(time.Duration(v)*26*time.Hour))
			e.RecordedAt = domain.Timestamp(recorded.Add(time.Duration(d.events) * time.Millisecond))
			evs[v] = e
			d.events++
		}
		d.streams = append(d.streams, evs)
	}
	return d
}

// readerSumsApply applies the streams to every read model the service
// feeds, readerSumsBatch streams per Apply, and returns how long it took.
func readerSumsApply(b *testing.B, ctx context.Context, d readerSumsData, appliers ...func(context.Context, []domain.Event) (projection.Outcome, map[string]error, error)) time.Duration {
	b.Helper()
	start := time.Now()
	for first := 0; first < len(d.streams); first += readerSumsBatch {
		var batch []domain.Event
		for _, evs := range d.streams[first:min(first+readerSumsBatch, len(d.streams))] {
			batch = append(batch, evs...)
		}
		if first%(10*readerSumsBatch) == 0 {
			readerSumsProgress("applying streams %d.. (%s)", first, time.Since(start).Round(time.Second))
		}
		for _, apply := range appliers {
			if _, poison, err := apply(ctx, batch); err != nil || len(poison) > 0 {
				b.Fatalf("apply streams %d..: poison %v, err %v", first, poison, err)
			}
		}
	}
	return time.Since(start)
}

// readerSumsPct is the p-th percentile (nearest rank) of sorted ds.
func readerSumsPct(ds []time.Duration, p float64) time.Duration {
	i := int(float64(len(ds))*p/100+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func readerSumsMean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func readerSumsMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkReaderSums times the reads that sum the order summaries:
// GET customer stats (Reader.CustomerStats) of 200 random customers, and
// the daily sales (Reader.DailySales) of one month and of the whole
// range, 10 times each, on a read model the size of the benchmark log
// (READERSUMS_CUSTOMERS and READERSUMS_REPEAT set other counts).
// Run it once: go test ./mongodb -run '^$' -bench BenchmarkReaderSums
// -benchtime 1x -timeout 30m.
func BenchmarkReaderSums(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	d := readerSumsGenerate(readerSumsSampleOrders * readerSumsCopies)
	if d.events != readerSumsEvents {
		b.Logf("generated %d events, not %d", d.events, readerSumsEvents)
	}

	db := storetest.Database(b)
	summaries := mongodb.NewReadModel(db, projection.OrderSummaries, readerSumsNoLog{}, nil)
	if err := summaries.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	built := readerSumsApply(b, ctx, d, summaries.Apply)
	b.Logf("read model: %d order streams, %d events, %d customers; order_summaries built in %s (%d streams per Apply)",
		len(d.streams), d.events, len(d.orders), built.Round(time.Millisecond), readerSumsBatch)

	reader := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	r := rand.New(rand.NewPCG(readerSumsSeed, 1))
	picked := make([]string, readerSumsCount(b, "READERSUMS_CUSTOMERS", 200))
	repeat := readerSumsCount(b, "READERSUMS_REPEAT", 10)
	for i := range picked {
		picked[i] = d.customers[r.IntN(len(d.customers))]
	}
	month := readerSumsFirstDay.AddDate(1, 0, 0)
	last := readerSumsFirstDay.AddDate(0, 0, readerSumsDays+1)

	b.ResetTimer()
	for range b.N {
		stats := make([]time.Duration, len(picked))
		for i, c := range picked {
			start := time.Now()
			s, err := reader.CustomerStats(ctx, c)
			stats[i] = time.Since(start)
			readerSumsProgress("CustomerStats %d/%d: %s", i+1, len(picked), stats[i].Round(time.Microsecond))
			if err != nil {
				b.Fatal(err)
			}
			if s.OrderCount != d.orders[c] {
				b.Fatalf("customer %s: %d orders, want %d", c, s.OrderCount, d.orders[c])
			}
		}
		var rows []domain.DailySales
		sales := func(from, to time.Time) []time.Duration {
			ds := make([]time.Duration, repeat)
			for i := range ds {
				start := time.Now()
				var err error
				rows, _, err = reader.DailySales(ctx, from, to, "")
				ds[i] = time.Since(start)
				readerSumsProgress("DailySales %s to %s %d/%d: %s", projection.SaleDay(from), projection.SaleDay(to), i+1, len(ds), ds[i].Round(time.Microsecond))
				if err != nil {
					b.Fatal(err)
				}
				if len(rows) == 0 {
					b.Fatalf("daily sales %s to %s: no rows", from, to)
				}
			}
			return ds
		}
		monthly := sales(month, month.AddDate(0, 1, -1))
		whole := sales(readerSumsFirstDay, last)
		var placed int64
		for _, row := range rows {
			placed += row.OrdersPlaced
		}
		if placed != int64(len(d.streams)) {
			b.Fatalf("daily sales of the whole range: %d orders placed, want %d", placed, len(d.streams))
		}

		var table strings.Builder
		fmt.Fprintf(&table, "\n%-34s %5s %10s %10s %10s %10s\n", "read", "n", "p50 ms", "p99 ms", "mean ms", "max ms")
		row := func(name string, ds []time.Duration) {
			s := slices.Sorted(slices.Values(ds))
			fmt.Fprintf(&table, "%-34s %5d %10.2f %10.2f %10.2f %10.2f\n", name, len(s),
				readerSumsMs(readerSumsPct(s, 50)), readerSumsMs(readerSumsPct(s, 99)), readerSumsMs(readerSumsMean(s)), readerSumsMs(s[len(s)-1]))
		}
		row(fmt.Sprintf("CustomerStats (%d customers)", len(stats)), stats)
		row("DailySales one month", monthly)
		row("DailySales whole range", whole)
		b.Log(table.String())

		s := slices.Sorted(slices.Values(stats))
		b.ReportMetric(readerSumsMs(readerSumsPct(s, 50)), "stats-p50-ms")
		b.ReportMetric(readerSumsMs(readerSumsPct(s, 99)), "stats-p99-ms")
		b.ReportMetric(readerSumsMs(readerSumsMean(s)), "stats-mean-ms")
		m := slices.Sorted(slices.Values(monthly))
		b.ReportMetric(readerSumsMs(readerSumsPct(m, 50)), "month-p50-ms")
		b.ReportMetric(readerSumsMs(m[len(m)-1]), "month-max-ms")
		w := slices.Sorted(slices.Values(whole))
		b.ReportMetric(readerSumsMs(readerSumsPct(w, 50)), "range-p50-ms")
		b.ReportMetric(readerSumsMs(w[len(w)-1]), "range-max-ms")
	}
	// After the loop: ResetTimer drops the metrics reported before it.
	b.ReportMetric(built.Seconds(), "build-s")
	b.ReportMetric(0, "ns/op")
}
