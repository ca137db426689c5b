package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Sizes of BenchmarkService. The raw inserts and the commands are as many,
// so the scratch collection and the event log end the same size: the
// embedded store's look-ups scan their table, and the figures fall as
// collections grow.
const (
	benchClients     = 32
	benchOrders      = 750                 // 4 commands each: place, approve, ship, deliver
	benchCommands    = 4 * benchOrders     // 3000
	benchRawInserts  = benchCommands       // 3000
	benchProbeEvery  = 10                  // every 10th command is followed by a visibility probe...
	benchProbeSlots  = 8                   // ...when fewer than 8 probes are waiting (see measureCommands)
	benchVisibleWait = "30s"               // ?wait of the probes
	benchScratch     = "bench_raw_commits" // the raw phase's collection
	benchDrainLimit  = 2 * time.Minute     // longest wait for the read models after the last command
)

// BenchmarkService measures, against its own embedded Main, in one run:
//
//  1. the store's raw limit: insertOne of commit-sized documents into a
//     scratch collection, from 32 goroutines;
//  2. REST command throughput: 32 clients each driving orders through
//     place, approve, ship and deliver;
//  3. accepted-to-visible latency: after every 10th command, the time from
//     its answer to the answer of GET /v1/order-summaries/{id}?min_version=
//     <its version>&wait=30s. Probes run beside the clients, which do not
//     wait for them, and at most 8 at a time: the server answers a waiting
//     GET by reading the read model every 2-50 ms, and on this store every
//     read scans the table, so unbounded probes load the store until they
//     starve the projection they wait for (single runs on the shared
//     2-core machine: no probes ~420 commands/s, at most 8 waiting ~300/s,
//     16 ~160/s, all 300 at once 25/s). A probe whose wait runs out
//     counts with the time it waited (about 30s): the percentiles are then
//     lower bounds, and the table says how many.
//
// It prints a table and reports the figures with b.ReportMetric. Run it
// with -benchtime 1x (make bench); it does its fixed work once whatever
// b.N is.
func BenchmarkService(b *testing.B) {
	m := runMain(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	db := m.mongo.Database(m.Config.Mongo.Database)

	b.ResetTimer()
	busy0, _ := m.StoreBusy()
	raw := measureRawInserts(ctx, b, db.Collection(benchScratch))
	busy1, _ := m.StoreBusy()
	writes0 := m.StoreWrites()
	ages0 := scrapeMetrics(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+m.HTTPAddr)
	cmdStart := time.Now()
	cmds := measureCommands(ctx, b, "http://"+m.HTTPAddr)
	busy2, _ := m.StoreBusy()
	writes1 := m.StoreWrites()
	cmdWall := time.Since(cmdStart) // the commands and the read models' drain after them
	b.StopTimer()
	// The share of each phase's wall time the store's single writer was
	// busy: near 1, the phase was bound by the store; well below, by the
	// service (or the clients).
	rawBusy, cmdBusy := (busy1-busy0).Seconds()/raw.elapsed.Seconds(), (busy2-busy1).Seconds()/cmdWall.Seconds()

	sizes := map[string]int64{}
	for _, name := range []string{benchScratch, mongodb.CommitsCollection, projection.OrderSummaries.Collection,
		mongodb.DeadLettersCollection} {
		n, err := db.Collection(name).CountDocuments(ctx, bson.D{})
		if err != nil {
			b.Errorf("count %s: %v", name, err)
		}
		sizes[name] = n
	}
	// The log is insert-only: nothing the run did (the commands, the
	// relay, the projections) wrote to a commit after its insert.
	writesEnd := m.StoreWrites()
	if kinds := logRewrites(writesEnd); len(kinds) > 0 {
		b.Errorf("writes to the event log other than inserts: %v", kinds)
	}

	rawRate := float64(benchRawInserts) / raw.elapsed.Seconds()
	cmdRate := float64(benchCommands) / cmds.elapsed.Seconds()
	rawP50, rawP99 := percentile(raw.latencies, 50), percentile(raw.latencies, 99)
	cmdP50, cmdP99 := percentile(cmds.latencies, 50), percentile(cmds.latencies, 99)
	visP50, visP99 := percentile(cmds.visible, 50), percentile(cmds.visible, 99)
	b.ReportMetric(rawRate, "raw_inserts/s")
	b.ReportMetric(ms(rawP50), "raw_p50_ms")
	b.ReportMetric(ms(rawP99), "raw_p99_ms")
	b.ReportMetric(cmdRate, "commands/s")
	b.ReportMetric(ms(cmdP50), "cmd_p50_ms")
	b.ReportMetric(ms(cmdP99), "cmd_p99_ms")
	b.ReportMetric(cmdRate/rawRate, "cmd_to_raw_ratio")
	b.ReportMetric(ms(visP50), "visible_p50_ms")
	b.ReportMetric(ms(visP99), "visible_p99_ms")
	b.ReportMetric(float64(visP99)/float64(rawP99), "visible_p99_to_raw_p99")
	b.ReportMetric(rawBusy, "raw_store_busy")
	b.ReportMetric(cmdBusy, "cmd_store_busy")

	var t strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&t, format, args...) }
	f("\nBenchmarkService: embedded FerretDB 1.24 on SQLite + embedded NATS, %d concurrent clients\n", benchClients)
	f("  %-44s %12s %12s %12s %12s\n", "measure", "count", "per second", "p50", "p99")
	f("  %-44s %12d %12.0f %12s %12s\n", "raw insertOne of a commit-sized document", benchRawInserts, rawRate, round(rawP50), round(rawP99))
	f("  %-44s %12d %12.0f %12s %12s\n", "REST commands (place/approve/ship/deliver)", benchCommands, cmdRate, round(cmdP50), round(cmdP99))
	f("  %-44s %12d %12s %12s %12s\n", "accepted-to-visible (summary min_version)", len(cmds.visible), "-", round(visP50), round(visP99))
	f("  (the scratch collection has only the _id index; the event log has 3 more: stream_first_version,\n")
	f("   stream_idempotency_key, recorded_at)\n")
	f("  commands/s to raw inserts/s       %.3f   (store busy: raw phase %.2f, commands and drain %.2f of wall time)\n", cmdRate/rawRate, rawBusy, cmdBusy)
	f("  visible p99 to raw insert p99     %.1f\n", float64(visP99)/float64(rawP99))
	f("  phase times                       raw %v, commands %v; read models complete %v after the last command answer\n",
		raw.elapsed.Round(time.Millisecond), cmds.elapsed.Round(time.Millisecond), cmds.drained.Round(time.Millisecond))
	f("  visibility probes                 %d (every %dth command, %d skipped: %d already waiting); %d ran out of their %s wait\n",
		len(cmds.visible), benchProbeEvery, cmds.skipped, benchProbeSlots, cmds.stale, benchVisibleWait)
	if cmds.stale > 0 {
		f("                                    so the visible percentiles are lower bounds\n")
	}
	f("  failed commands %d; summaries not at version 4 after the drain: %d\n", cmds.failed, cmds.undrained)
	end := scrapeMetrics(ctx, &http.Client{Timeout: 10 * time.Second}, "http://"+m.HTTPAddr)
	if a, e := cmds.atLast, end; a != nil && e != nil {
		const (
			pub = "orderd_relay_published_events_total"
			sum = `orderd_projection_events_applied_total{projection="order_summaries"}`
		)
		f("  at the last command answer        relay published %.0f of %d events; applied: order_summaries %.0f\n",
			a[pub], benchCommands, a[sum])
		f("  at the end                        relay published %.0f; applied: order_summaries %.0f\n",
			e[pub], e[sum])
		f("  relay at the end                  %.0f commits read and not yet acknowledged, lag %.3fs; %.0f failed rounds, %.0f catch-ups from the log\n",
			e["orderd_relay_commits_behind"], e["orderd_relay_lag_seconds"], e["orderd_relay_publish_errors_total"], e["orderd_relay_catchups_total"])
		if n := e["orderd_append_duration_seconds_count"]; n > 0 {
			f("  in-service insert of a commit     mean %s over %.0f appends (orderd_append_duration_seconds)\n",
				round(time.Duration(e["orderd_append_duration_seconds_sum"]/n*float64(time.Second))), n)
		}
		f("  command retries %.0f, append conflicts %.0f, projection gaps filled %.0f, projection batch errors %.0f\n",
			e["orderd_command_retries_total"], e["orderd_append_conflicts_total"],
			e[`orderd_projection_gaps_filled_total{projection="order_summaries"}`],
			e[`orderd_projection_errors_total{projection="order_summaries"}`])
	}
	f("  collection sizes reached          ")
	for i, name := range []string{benchScratch, mongodb.CommitsCollection, projection.OrderSummaries.Collection,
		mongodb.DeadLettersCollection} {
		if i > 0 {
			f(", ")
		}
		f("%s %d", name, sizes[name])
	}
	f("\n  writes to the event log other than inserts and its indexes: %v (the log is insert-only)\n", cmp.Or(strings.Join(logRewrites(writesEnd), ", "), "none"))
	t.WriteString(writeCosts(writes0, writes1, benchCommands))
	t.WriteString(hopTable(ages0, end))
	fmt.Fprint(os.Stdout, t.String())

	if sizes[benchScratch] != benchRawInserts || sizes[mongodb.CommitsCollection] != benchCommands ||
		sizes[projection.OrderSummaries.Collection] != benchOrders {
		b.Errorf("collection sizes %v; want %d raw documents, %d commits, %d summaries", sizes, benchRawInserts, benchCommands, benchOrders)
	}
}

// rawResult is the raw phase's wall time and per-insert latencies.
type rawResult struct {
	elapsed   time.Duration
	latencies []time.Duration
}

// measureRawInserts inserts benchRawInserts commit-sized documents into coll
// from benchClients goroutines.
func measureRawInserts(ctx context.Context, b *testing.B, coll *mongo.Collection) rawResult {
	b.Helper()
	_ = coll.Drop(ctx)
	if err := coll.Database().CreateCollection(ctx, coll.Name()); err != nil {
		b.Fatalf("create %s: %v", coll.Name(), err)
	}
	lat := make([]time.Duration, benchRawInserts)
	var failed atomic.Int64
	start := time.Now()
	parallel(ctx, benchRawInserts, benchClients, func(i int) {
		doc := commitLike(i)
		t0 := time.Now()
		_, err := coll.InsertOne(ctx, doc)
		lat[i] = time.Since(t0)
		if err != nil && failed.Add(1) <= 3 {
			b.Errorf("raw insert %d: %v", i, err)
		}
	})
	return rawResult{elapsed: time.Since(start), latencies: lat}
}

// parallel calls do for each of 0..n-1 from workers goroutines, each
// taking the next number, and returns when they are done or, once ctx
// has ended, when the calls under way are.
func parallel(ctx context.Context, n, workers int, do func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				do(i)
			}
		})
	}
	wg.Wait()
}

// commitLike is a document shaped like the event log's commit of an
// OrderPlaced event: the same fields and types, one event whose data has
// the four fields of OrderPlaced (one line item).
func commitLike(i int) bson.D {
	stream := fmt.Sprintf("bench-raw-%06d", i)
	now := time.Now().UTC().Truncate(time.Millisecond)
	return bson.D{
		{Key: "_id", Value: mongodb.CommitID(stream, 1)},
		{Key: "stream_id", Value: stream},
		{Key: "stream_type", Value: "order"},
		{Key: "first_version", Value: int64(1)},
		{Key: "last_version", Value: int64(1)},
		{Key: "events", Value: bson.A{bson.D{
			{Key: "event_id", Value: fmt.Sprintf("0190c0de-0000-7000-8000-%012d", i)},
			{Key: "type", Value: "OrderPlaced"},
			{Key: "version", Value: int64(1)},
			{Key: "occurred_at", Value: now},
			{Key: "recorded_at", Value: now},
			{Key: "data", Value: bson.D{
				{Key: "customer_id", Value: fmt.Sprintf("bench-customer-%04d", i%500)},
				{Key: "currency", Value: "BRL"},
				{Key: "items", Value: bson.A{bson.D{
					{Key: "sku", Value: "sku-4244733e06e7ecb4970a6e2683c13e61"},
					{Key: "quantity", Value: int64(1)},
					{Key: "unit_price_cents", Value: int64(5890)},
				}}},
				{Key: "freight_cents", Value: int64(1329)},
			}},
			{Key: "correlation_id", Value: fmt.Sprintf("0190c0de-0000-7000-9000-%012d", i)},
			{Key: "causation_id", Value: fmt.Sprintf("0190c0de-0000-7000-9000-%012d", i)},
			{Key: "schema_version", Value: int32(1)},
		}}},
		{Key: "recorded_at", Value: now},
	}
}

// cmdResult is the REST phase's outcome.
type cmdResult struct {
	elapsed   time.Duration      // first command sent to last command answered
	latencies []time.Duration    // per command
	visible   []time.Duration    // per probe, until its answer (a stale one's included)
	stale     int                // probes whose wait ran out (stale summary, or 404: none yet)
	skipped   int                // probe candidates skipped: benchProbeSlots were waiting
	failed    int                // commands not answered 2xx
	drained   time.Duration      // last command answered to every summary at version 4
	undrained int                // summaries not at version 4 when the drain gave up
	atLast    map[string]float64 // /metrics when the last command was answered
}

// measureCommands drives benchOrders orders through four commands each
// from benchClients clients, probing the read model after every
// benchProbeEvery-th command when a probe slot is free, then waits for the
// read models to apply every event.
func measureCommands(ctx context.Context, b *testing.B, base string) cmdResult {
	b.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * benchClients
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections()

	var (
		res      cmdResult
		mu       sync.Mutex
		nextCmd  atomic.Int64
		failed   atomic.Int64
		probes   sync.WaitGroup
		slots    = make(chan struct{}, benchProbeSlots)
		skipped  atomic.Int64
		lat      = make([]time.Duration, benchCommands)
		reported atomic.Int64
	)
	errorf := func(format string, args ...any) {
		if reported.Add(1) <= 5 {
			b.Errorf(format, args...)
		}
	}
	// send posts one command and returns when its answer is read.
	send := func(id, path, body string, want int) (version int64, answered time.Time, ok bool) {
		i := int(nextCmd.Add(1)) - 1
		t0 := time.Now()
		resp, data, answered, err := post(ctx, hc, base+path, body)
		if resp == nil {
			failed.Add(1)
			errorf("POST %s: %v", path, err)
			return 0, time.Time{}, false
		}
		if i < len(lat) {
			lat[i] = answered.Sub(t0)
		}
		if err != nil || resp.StatusCode != want {
			failed.Add(1)
			errorf("POST %s: %d %s (%v)", path, resp.StatusCode, data, err)
			return 0, answered, false
		}
		etag := strings.Trim(resp.Header.Get("ETag"), `"`)
		if _, err := fmt.Sscan(etag, &version); err != nil {
			errorf("POST %s: ETag %q", path, resp.Header.Get("ETag"))
		}
		if (i+1)%benchProbeEvery == 0 {
			select {
			case slots <- struct{}{}:
				probes.Go(func() {
					defer func() { <-slots }()
					probe(ctx, hc, base, id, version, answered, &mu, &res, errorf)
				})
			default:
				skipped.Add(1)
			}
		}
		return version, answered, true
	}

	start := time.Now()
	var last atomic.Int64 // unix nanos of the last command answer
	parallel(ctx, benchOrders, benchClients, func(n int) {
		id := fmt.Sprintf("bench-order-%05d", n)
		place := fmt.Sprintf(`{"order_id":%q,"customer_id":"bench-customer-%03d","currency":"BRL","items":[{"sku":"sku-%03d","quantity":%d,"unit_price_cents":%d}],"freight_cents":%d}`,
			id, n%100, n%37, 1+n%3, 990+n, 500)
		steps := []struct {
			path, body string
			want       int
		}{
			{"/v1/orders", place, http.StatusCreated},
			{"/v1/orders/" + id + "/approve", "", http.StatusOK},
			{"/v1/orders/" + id + "/ship", "", http.StatusOK},
			{"/v1/orders/" + id + "/deliver", "", http.StatusOK},
		}
		for _, s := range steps {
			_, answered, ok := send(id, s.path, s.body, s.want)
			if at := answered.UnixNano(); at > 0 {
				for {
					l := last.Load()
					if at <= l || last.CompareAndSwap(l, at) {
						break
					}
				}
			}
			if !ok {
				break
			}
		}
	})
	lastAnswer := time.Unix(0, last.Load())
	res.elapsed = lastAnswer.Sub(start)
	res.latencies = lat[:min(int(nextCmd.Load()), len(lat))]

	res.atLast = scrapeMetrics(ctx, hc, base)
	probes.Wait()
	res.skipped = int(skipped.Load())

	// The read model is complete when its projection has applied every
	// event; /metrics tells without loading the store.
	deadline := lastAnswer.Add(benchDrainLimit)
	for {
		mt := scrapeMetrics(ctx, hc, base)
		if mt[`orderd_projection_events_applied_total{projection="order_summaries"}`] >= benchCommands {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			errorf("read models incomplete %v after the last command: %v", benchDrainLimit, mt)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.drained = time.Since(lastAnswer)

	// Then every summary is at version 4.
	var undrained atomic.Int64
	parallel(ctx, benchOrders, 4, func(n int) {
		path := fmt.Sprintf("/v1/order-summaries/bench-order-%05d?min_version=4&wait=10s", n)
		if code, stale, err := get(ctx, hc, base+path); err != nil || code != http.StatusOK || stale {
			undrained.Add(1)
			errorf("GET %s: %d stale %v %v", path, code, stale, err)
		}
	})
	res.undrained = int(undrained.Load())
	res.failed = int(failed.Load())
	return res
}

// post POSTs body (none when "") to url and reads the answer in full:
// the response (nil when none came), its body, when it was read, and the
// error of the request or of reading the body.
func post(ctx context.Context, hc *http.Client, url, body string) (*http.Response, []byte, time.Time, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, "POST", url, rd)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, time.Now(), err
}

// probe waits for the summary of order id at version (its command was
// answered at answered), and records the time from that answer to its own.
func probe(ctx context.Context, hc *http.Client, base, id string, version int64, answered time.Time,
	mu *sync.Mutex, res *cmdResult, errorf func(string, ...any)) {
	url := fmt.Sprintf("%s/v1/order-summaries/%s?min_version=%d&wait=%s", base, id, version, benchVisibleWait)
	code, stale, err := get(ctx, hc, url)
	d := time.Since(answered)
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err == nil && (code == http.StatusNotFound || code == http.StatusOK && stale):
		res.stale++ // the summary did not reach the version within the wait
		res.visible = append(res.visible, d)
	case err != nil || code != http.StatusOK:
		errorf("GET %s: %d %v", url, code, err)
	default:
		res.visible = append(res.visible, d)
	}
}

// get GETs url and reads the answer in full; stale reports
// X-Read-Model-Stale: true.
func get(ctx context.Context, hc *http.Client, url string) (code int, stale bool, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Read-Model-Stale") == "true", err
}

// scrapeMetrics reads /metrics into a map from series ("name{labels}") to
// value; nil when it cannot.
func scrapeMetrics(ctx context.Context, hc *http.Client, base string) map[string]float64 {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// stageAge is one stage of an event's way from its commit to a reader,
// as a histogram of /metrics: the event's age when it passed the stage.
type stageAge struct {
	stage, name, labels string // labels: as in the series, before le ("" for none)
}

// eventStages are the stages of a command's event, in order: the hops of
// accepted-to-visible.
var eventStages = []stageAge{
	{"read by the relay", "orderd_relay_commit_age_seconds", `stage="read",`},
	{"acknowledged by JetStream", "orderd_relay_commit_age_seconds", `stage="acknowledged",`},
	{"delivered to the projector", "orderd_projection_event_age_seconds", `projection="order_summaries",stage="delivered",`},
	{"applied to order_summaries", "orderd_projection_event_age_seconds", `projection="order_summaries",stage="applied",`},
	{"read by a reader that waited for it", "orderd_summary_event_age_seconds", ``},
}

// hopTable is the table of where an event's time went between two
// readings of /metrics: at each stage, how many events passed it, and
// their age since their commit's recorded time (mean, and p50 and p99
// interpolated within the histogram's buckets, as PromQL's
// histogram_quantile does); the hop is the mean's growth since the stage
// before.
func hopTable(before, after map[string]float64) string {
	var t strings.Builder
	fmt.Fprintf(&t, "  an event's age since its commit at each stage (histograms in /metrics, over the commands and the drain):\n")
	fmt.Fprintf(&t, "    %-40s %7s %10s %10s %10s %10s\n", "stage", "count", "mean", "p50", "p99", "hop (mean)")
	prev := 0.0
	for _, st := range eventStages {
		series := st.name + "_count"
		if st.labels != "" {
			series += "{" + strings.TrimSuffix(st.labels, ",") + "}"
		}
		n := after[series] - before[series]
		sumSeries := strings.Replace(series, "_count", "_sum", 1)
		sum := after[sumSeries] - before[sumSeries]
		if n <= 0 {
			fmt.Fprintf(&t, "    %-40s %7d\n", st.stage, 0)
			continue
		}
		buckets := histogramBuckets(before, after, st.name+"_bucket{"+st.labels+`le="`)
		mean := sum / n
		fmt.Fprintf(&t, "    %-40s %7.0f %10s %10s %10s %10s\n", st.stage, n, round(seconds(mean)),
			round(seconds(bucketQuantile(buckets, 0.50))), round(seconds(bucketQuantile(buckets, 0.99))), round(seconds(mean-prev)))
		prev = mean
	}
	return t.String()
}

// bucket is a histogram bucket: its upper bound and the observations at
// or below it.
type bucket struct{ le, count float64 }

// histogramBuckets returns the buckets of the series starting with prefix
// (up to the le label's value), as their growth from before to after,
// ordered by bound.
func histogramBuckets(before, after map[string]float64, prefix string) []bucket {
	var bs []bucket
	for k, v := range after {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(rest, `"}`), 64)
		if err != nil {
			continue // +Inf is the count
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	return bs
}

// bucketQuantile is the q-quantile of buckets, linear within the bucket
// it falls in; the largest bound when it falls above them.
func bucketQuantile(bs []bucket, q float64) float64 {
	if len(bs) == 0 {
		return 0
	}
	total := bs[len(bs)-1].count
	rank, lower, below := q*total, 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank && b.count > below {
			return lower + (b.le-lower)*(rank-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return bs[len(bs)-1].le
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// writeCosts is a table of where the embedded store's single writer spent
// its time between two readings of Main.StoreWrites: each kind of write
// (command and collection) with its count, its count per command, its
// time held in all and per command, and its mean wait for the writer (the
// queue by kind: whether one kind starves another), the largest first;
// "" on MongoDB.
func writeCosts(before, after map[string]WriteCost, commands int) string {
	if after == nil {
		return ""
	}
	type row struct {
		kind string
		WriteCost
	}
	var rows []row
	var all time.Duration
	for k, c := range after {
		d := WriteCost{Writes: c.Writes - before[k].Writes, Held: c.Held - before[k].Held, Waited: c.Waited - before[k].Waited}
		if d.Writes > 0 {
			rows = append(rows, row{k, d})
			all += d.Held
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.Held, a.Held) })
	var t strings.Builder
	fmt.Fprintf(&t, "  the store's writer, by kind of write, over %d commands (and the read models' drain):\n", commands)
	fmt.Fprintf(&t, "    %-40s %9s %11s %10s %6s %12s %10s\n", "write", "count", "per command", "held", "share", "per command", "mean wait")
	for _, r := range rows {
		fmt.Fprintf(&t, "    %-40s %9d %11.2f %10s %5.1f%% %12s %10s\n", r.kind, r.Writes, float64(r.Writes)/float64(commands),
			r.Held.Round(time.Millisecond), 100*r.Held.Seconds()/all.Seconds(), round(r.Held/time.Duration(commands)),
			round(r.Waited/time.Duration(r.Writes)))
	}
	return t.String()
}
