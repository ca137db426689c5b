package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// Sizes and settings of BenchmarkRebuild.
const (
	rebuildServiceEvents = 100_000                // events appended through domain.Service (at most, and the default size)
	rebuildLoaders       = 16                     // goroutines appending the log
	rebuildBulk          = 1000                   // commits per InsertMany of the bulk copies
	rebuildBulkWriters   = 2                      // InsertMany calls in flight
	rebuildScanBatch     = 512                    // batch size of the raw scans: mongodb.EventStore.Scan's
	rebuildPollJob       = 500 * time.Millisecond // how often the benchmark reads the job
	rebuildLimit         = 25 * time.Minute       // longest run per 100,000 events (make bench allows 30m for all benchmarks)
	rebuildSample        = "../../testdata/olist-sample"
)

// Flags of BenchmarkRebuild; make bench uses the defaults, make bench-1m
// sets -rebuild.events=1000000 -rebuild.partitions=1 -rebuild.sorted-scan=false.
var (
	rebuildEvents = flag.Int("rebuild.events", rebuildServiceEvents,
		"BenchmarkRebuild: the log holds at least this many events (whole copies of the Olist sample)")
	rebuildPartitions = flag.String("rebuild.partitions", "1,2",
		"BenchmarkRebuild: comma-separated partition counts, one rebuild each, in this order")
	rebuildSortedScan = flag.Bool("rebuild.sorted-scan", true,
		"BenchmarkRebuild: also time Find({}) sorted by _id (FerretDB sorts in memory: about 10 KiB of RSS per commit)")
)

// BenchmarkRebuild measures rebuilding the order_summaries read model from
// the event log, in one run against its own embedded Main booted with the
// jobs role only (no API, relay or projector, so nothing else writes), the
// default job concurrency (jobs.DefaultConcurrency tasks at a time), no
// settle (the default) and the default batch of 500 streams per checkpoint:
//
//  1. setup, not timed: the log is filled with copies of the Olist sample
//     (4,071 orders, 16,173 events) until it holds at least
//     -rebuild.events events (default 100,000: 7 copies, 113,211 events in
//     as many commits, 28,497 order streams; 1,000,000: 62 copies,
//     1,002,726 events, 252,402 streams; ids "c<copy>-<olist id>"). The
//     copies up to 100,000 events have each order's plan run through
//     domain.Service on the real mongodb.EventStore, from 16 goroutines,
//     with the replay tool's idempotency keys; commands the plan lists as
//     refused are not sent (they would append nothing). Copies beyond are
//     copy 0's commits as stored, given the copy's stream ids, commit ids,
//     idempotency keys, new event, correlation and causation ids, and the
//     insert time as recorded_at, and inserted into the events collection
//     with InsertMany in bulks of 1,000 (2 in flight): documents of the
//     same shape and size, in a fraction of the time (the Service appends
//     about 1,000 events/s here).
//  2. the store's raw scan rate of the log, events/s: a Find({}) of the
//     events collection decoding each commit to bson.Raw and counting its
//     events, then (unless -rebuild.sorted-scan=false) the same Find
//     sorted by _id, in log order (FerretDB 1.24 sorts in memory: 1.1 GB
//     of RSS at 113k commits); both in batches of 512, as the scan.
//  3. one rebuild per count of -rebuild.partitions (default 1, then 2),
//     each started after the previous one finished and timed from
//     Jobs.StartRebuild to the job's final state: the plan (commit count,
//     partition bounds) and claim, the scan of the log into a new
//     collection, the verify of that collection against the sums the scan
//     recorded (a fresh fold from the log only of the documents that
//     differ) and the pointer switch. Each must succeed and count every event of the log.
//     The table gives its rate, its ratio to the raw scan rate, the
//     2-partition speed-up over 1 (when both ran), how long the
//     partitions were all scanning at once, and where the time went.
//  4. the process's peak RSS in each phase: VmHWM from /proc/self/status
//     after writing 5 to /proc/self/clear_refs (Linux; the table says
//     when the reset failed). The embedded store runs in this process, so
//     the RSS includes it.
//
// The figures are from the embedded store (FerretDB 1.24 on SQLite), not
// from MongoDB, and they follow from how that store reads: only a filter
// of _id equality reaches SQLite, so every other query (a partition's _id
// range, a count, a sort) decodes the whole collection, and sorts are done
// in memory. A rebuild therefore reads the log twice or more (the plan's
// count, and for several partitions its bounds, then the scan), and 2
// partitions decode it twice side by side. Run it
// with -benchtime 1x (make bench); it does its fixed work once whatever
// b.N is; the README gives the figures of one run.
func BenchmarkRebuild(b *testing.B) {
	b.StopTimer()
	partitions, err := parsePartitions(*rebuildPartitions)
	if err != nil {
		b.Fatalf("-rebuild.partitions: %v", err)
	}
	if *rebuildEvents < 1 {
		b.Fatalf("-rebuild.events=%d: want at least 1", *rebuildEvents)
	}
	limit := rebuildLimit * time.Duration(max(1, (*rebuildEvents+rebuildServiceEvents-1)/rebuildServiceEvents))
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	loadStart := loadAverage()
	resetOK := resetPeakRSS()
	rssBoot := currentRSS()
	m := runMainDir(b, b.TempDir(), func(c *Config) {
		c.Roles = "jobs"
		// The job settings are the service's defaults, so that the
		// partitions run as "orderd rebuild -partitions N" runs them on
		// one instance. Nothing is appended while a rebuild runs: the
		// rollup's build need not wait the margin that covers appends.
		c.Relay.CatchUpMargin = time.Second
	})
	db := m.mongo.Database(m.Config.Mongo.Database)
	store := mongodb.NewEventStore(db)
	// The jobs as the API asks for them; the service's worker runs them.
	ps := mongodb.NewPointers(db)
	scheduler := jobs.New(mongodb.NewJobs(db), ps, store, mongodb.NewProjection(db, projection.OrderSummaries, store, nil, ps),
		projection.NewRollup(projection.DailySales, mongodb.NewRollups(db), store, nil, ps, nil, 0))

	loaded := loadOlistCopies(ctx, b, db, store, *rebuildEvents, rebuildServiceEvents)
	progressf("loaded %d events (%d copies of %d orders) in %v", loaded.events, loaded.copies, loaded.orders,
		(loaded.elapsed + loaded.bulkElapsed).Round(time.Second))

	events := db.Collection(mongodb.CommitsCollection)
	b.StartTimer()
	raw := rawScan(ctx, b, events, false)
	if raw.events != loaded.events {
		b.Fatalf("the raw scan counted %d events in %d commits; the load appended %d events", raw.events, raw.docs, loaded.events)
	}
	var sorted scanResult
	if *rebuildSortedScan {
		sorted = rawScan(ctx, b, events, true)
		if sorted.events != raw.events || sorted.docs != raw.docs {
			b.Fatalf("the sorted scan counted %d events in %d commits, the raw scan %d in %d", sorted.events, sorted.docs, raw.events, raw.docs)
		}
	}
	logEvents := raw.events
	var runs []rebuildRun
	for _, p := range partitions {
		runs = append(runs, runRebuild(ctx, b, scheduler, projection.OrderSummaries.Name, p, logEvents, loaded.orders))
	}
	// The daily sales rollup, built from the same log in one partition.
	sales := runRebuild(ctx, b, scheduler, projection.DailySales.Name, 1, logEvents, loaded.orders)
	b.StopTimer()

	last := runs[len(runs)-1]
	ptr, err := mongodb.NewPointers(db).Get(ctx, projection.OrderSummaries.Name, projection.OrderSummaries.Collection, 0)
	if err != nil {
		b.Errorf("read the pointer: %v", err)
	} else if ptr.Active != last.job.Shadow {
		b.Errorf("order_summaries reads %q, want the last rebuild's %q", ptr.Active, last.job.Shadow)
	}

	rawRate := raw.rate()
	byCount := map[int]rebuildRun{}
	b.ReportMetric(rawRate, "raw_scan_events/s")
	if *rebuildSortedScan {
		b.ReportMetric(sorted.rate(), "raw_sorted_scan_events/s")
		b.ReportMetric(mib(sorted.rss.peak), "peak_rss_MiB_sorted_scan")
	}
	b.ReportMetric(float64(logEvents), "log_events")
	b.ReportMetric(mib(loaded.rss.peak), "peak_rss_MiB_load")
	b.ReportMetric(mib(raw.rss.peak), "peak_rss_MiB_raw_scan")
	for _, r := range runs {
		byCount[r.partitions] = r
		b.ReportMetric(r.rate(), fmt.Sprintf("rebuild_events/s_p%d", r.partitions))
		b.ReportMetric(r.rate()/rawRate, fmt.Sprintf("ratio_to_raw_scan_p%d", r.partitions))
		b.ReportMetric(mib(r.rss.peak), fmt.Sprintf("peak_rss_MiB_p%d", r.partitions))
		if r.partitions > 1 {
			b.ReportMetric(overlap(r.parts).Seconds(), fmt.Sprintf("parallel_scan_s_p%d", r.partitions))
		}
	}
	b.ReportMetric(sales.rate(), "rollup_rebuild_events/s")
	b.ReportMetric(mib(sales.rss.peak), "peak_rss_MiB_rollup")
	p1, ok1 := byCount[1]
	p2, ok2 := byCount[2]
	var speedup float64
	if ok1 && ok2 {
		speedup = p2.rate() / p1.rate()
		b.ReportMetric(speedup, "speedup_p2")
	}

	var t strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&t, format, args...) }
	f("\nBenchmarkRebuild: embedded FerretDB 1.24 on SQLite in this process, jobs role only, job concurrency %d\n", m.Config.Jobs.Concurrency)
	f("  log: %d events in %d commits, %d order streams (%d copies of the %d Olist sample orders)\n",
		logEvents, raw.docs, loaded.orders, loaded.copies, loaded.orders/loaded.copies)
	f("  %-46s %10s %10s %10s %8s %9s %9s\n", "measure", "events", "time", "events/s", "to raw", "RSS MiB", "peak MiB")
	row := func(name string, n int64, d time.Duration, rate, ratio float64, rss phaseRSS) {
		r := "-"
		if ratio > 0 {
			r = fmt.Sprintf("%.3f", ratio)
		}
		f("  %-46s %10d %10s %10.0f %8s %9.0f %9.0f\n", name, n, d.Round(100*time.Millisecond), rate, r, mib(rss.before), mib(rss.peak))
	}
	row(fmt.Sprintf("load: Service + Store.Append, %d goroutines", rebuildLoaders), loaded.events-loaded.bulkEvents, loaded.elapsed,
		float64(loaded.events-loaded.bulkEvents)/loaded.elapsed.Seconds(), 0, loaded.rss)
	if loaded.bulkCopies > 0 {
		row(fmt.Sprintf("load: InsertMany of copy 0, %d copies", loaded.bulkCopies), loaded.bulkEvents, loaded.bulkElapsed,
			float64(loaded.bulkEvents)/loaded.bulkElapsed.Seconds(), 0, loaded.bulkRSS)
	}
	row("raw scan: Find({}) of events, bson.Raw", raw.events, raw.elapsed, rawRate, 1, raw.rss)
	if *rebuildSortedScan {
		row("raw scan: Find({}) sorted by _id (log order)", sorted.events, sorted.elapsed, sorted.rate(), sorted.rate()/rawRate, sorted.rss)
	}
	for _, r := range runs {
		row(fmt.Sprintf("rebuild order_summaries, %d partition(s)", r.partitions), r.job.Events, r.elapsed, r.rate(), r.rate()/rawRate, r.rss)
	}
	row("rebuild daily_sales (rollup), 1 partition", sales.job.Events, sales.elapsed, sales.rate(), sales.rate()/rawRate, sales.rss)
	if ok := len(runs) > 0 && runs[0].partitions == 1; ok {
		f("  the rollup's build takes %.2f of the summaries' rebuild time, 1 partition each (its build waits %v for the cut)\n",
			sales.elapsed.Seconds()/runs[0].elapsed.Seconds(), 2*m.Config.Relay.CatchUpMargin)
		b.ReportMetric(sales.elapsed.Seconds()/runs[0].elapsed.Seconds(), "rollup_to_summaries_time")
	}
	f("  (load is setup, not timed; a rebuild's time runs from StartRebuild to the job's finished_at; RSS MiB is\n")
	f("   the RSS when the phase began, after returning free Go memory to the OS)\n")
	if speedup > 0 {
		f("  2-partition speed-up over 1         %.2fx\n", speedup)
	}
	for _, r := range append(runs, sales) {
		f("  rebuild of %s with %d partition(s)\n", r.job.Projection, r.partitions)
		f("    StartRebuild                      %v (lock, tasks, pointer)\n", r.create.Round(time.Millisecond))
		f("    plan                              %v (commit count, partition bounds)\n", r.plan.Round(time.Millisecond))
		f("    plan + claim                      %v\n", r.queued.Round(time.Millisecond))
		f("    scan of the log into %-12s %v, %.0f events/s", "the shadow", r.scan.Round(100*time.Millisecond), float64(r.job.Events)/r.scan.Seconds())
		if len(r.parts) > 1 {
			f(" (partitions:")
			for i, p := range r.parts {
				f(" %d events in %v", p.Events, p.FinishedAt.Sub(p.StartedAt).Round(100*time.Millisecond))
				if i < len(r.parts)-1 {
					f(",")
				}
			}
			f(")")
		}
		f("\n")
		if len(r.parts) > 1 {
			f("    all partitions scanning at once   %v\n", overlap(r.parts).Round(100*time.Millisecond))
		}
		f("    last partition to finish claimed  %v\n", r.handoff.Round(time.Millisecond))
		f("    finish: verify sums + switch      %v", r.finish.Round(100*time.Millisecond))
		if rep := r.job.Report; rep != nil {
			f(" (verified %d documents against %d recorded sums; drift %d, repaired %d)", rep.Documents, rep.Streams, rep.Drift(), rep.Repaired)
		}
		f("\n")
		f("    job: %s, %d events, %d streams, %d poison; the job's own rate %.0f events/s\n",
			r.job.State, r.job.Events, r.job.Streams, r.job.PoisonStreams, r.job.RatePerSecond)
	}
	f("  load: %d commands through the Service from %d orders, %d skipped as the plans' documented refusals",
		loaded.commands, loaded.orders/loaded.copies*(loaded.copies-loaded.bulkCopies), loaded.refused)
	if loaded.bulkCopies > 0 {
		f("; %d events in %d copies of copy 0 by InsertMany of %d, %d at a time", loaded.bulkEvents, loaded.bulkCopies, rebuildBulk, rebuildBulkWriters)
	}
	f("\n")
	f("  RSS is the whole process's: the embedded store (FerretDB and SQLite) runs in it with the benchmark\n")
	if !resetOK {
		f("  writing 5 to /proc/self/clear_refs failed: each peak is the highest since the process started\n")
	}
	f("  RSS after boot %.0f MiB; load average (shared machine, %d CPUs) %s at the start, %s at the end\n",
		mib(rssBoot), runtime.NumCPU(), loadStart, loadAverage())
	fmt.Fprint(os.Stdout, t.String())
}

// rebuildLoad is what loadOlistCopies appended.
type rebuildLoad struct {
	copies, orders    int   // orders counts every copy's
	commands, refused int   // commands appended through the Service; commands skipped as documented refusals
	events            int64 // every copy's
	elapsed           time.Duration
	rss               phaseRSS
	bulkCopies        int   // copies inserted with InsertMany
	bulkEvents        int64 // their events (one per commit)
	bulkElapsed       time.Duration
	bulkRSS           phaseRSS
}

// phaseRSS is the process's RSS when a phase began and its peak during it,
// in bytes.
type phaseRSS struct{ before, peak int64 }

// loaderStep is one command of an Olist plan.
type loaderStep struct {
	name string
	cmd  domain.Command
}

// loadOlistCopies appends copies of the Olist sample's orders until the
// log holds at least want events; each copy's order ids are
// "c<copy>-<olist id>". The copies up to serviceEvents (at least one
// copy) run each order's commands in order through a domain.Service on
// store, orders spread over rebuildLoaders goroutines; the copies beyond
// are copy 0's commits inserted into db's events collection by bulkCopies.
func loadOlistCopies(ctx context.Context, b *testing.B, db *mongo.Database, store *mongodb.EventStore, want, serviceEvents int) rebuildLoad {
	b.Helper()
	ds, err := olist.Load(rebuildSample)
	if err != nil {
		b.Fatalf("load the Olist sample: %v", err)
	}
	var res rebuildLoad
	ids := make([]string, len(ds.Orders))
	plans := make([][]loaderStep, len(ds.Orders))
	perCopy := 0
	for i, o := range ds.Orders {
		p := ds.Plan(o)
		ids[i] = o.ID
		for _, c := range p.Commands {
			if slices.Contains(p.Refused, domain.CommandName(c)+": invalid-transition") {
				res.refused++
				continue
			}
			plans[i] = append(plans[i], loaderStep{name: domain.CommandName(c), cmd: c})
		}
		perCopy += len(plans[i]) // one event per accepted command
	}
	res.copies = (want + perCopy - 1) / perCopy
	serviceCopies := min(res.copies, max(1, (min(want, serviceEvents)+perCopy-1)/perCopy))
	res.refused *= serviceCopies
	res.orders = serviceCopies * len(plans)
	resetPeakRSS()
	res.rss.before = currentRSS()

	var (
		next, events, commands, failed atomic.Int64
		wg                             sync.WaitGroup
	)
	start := time.Now()
	for range rebuildLoaders {
		wg.Go(func() {
			// The loader's own state cache (it runs one order at a time),
			// so its commands need no read before their append, as in the
			// service.
			cache, _ := lru.New[string, domain.Order](64)
			svc := domain.NewService(store, cache)
			svc.NewID = func() string { return uuid.Must(uuid.NewV7()).String() }
			for {
				n := int(next.Add(1)) - 1
				if n >= res.orders || ctx.Err() != nil {
					return
				}
				i := n % len(plans)
				id := fmt.Sprintf("c%d-%s", n/len(plans), ids[i])
				for k, s := range plans[i] {
					key := olist.IdempotencyKey(id, s.cmd)
					r, err := svc.Execute(ctx, id, s.cmd, domain.ExecOptions{IdempotencyKey: key})
					if err == nil && (r.Replayed || r.Version != int64(k+1)) {
						err = fmt.Errorf("answer %+v, want a new version %d", r, k+1)
					}
					if err != nil {
						if failed.Add(1) <= 3 {
							b.Errorf("load %s %s: %v", id, s.name, err)
						}
						break
					}
					commands.Add(1)
					events.Add(1)
				}
				cache.Purge()
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	if n := failed.Load(); n > 0 || ctx.Err() != nil {
		b.Fatalf("loading the log: %d commands failed (%v)", n, ctx.Err())
	}
	res.commands, res.events = int(commands.Load()), events.Load()
	res.rss.peak = peakRSS()

	if res.bulkCopies = res.copies - serviceCopies; res.bulkCopies > 0 {
		resetPeakRSS()
		res.bulkRSS.before = currentRSS()
		start := time.Now()
		res.bulkEvents = bulkCopies(ctx, b, db.Collection(mongodb.CommitsCollection), serviceCopies, res.copies)
		res.bulkElapsed = time.Since(start)
		res.bulkRSS.peak = peakRSS()
		res.events += res.bulkEvents
		res.orders = res.copies * len(plans)
	}
	if res.events < int64(want) {
		b.Fatalf("the log holds %d events, want at least %d", res.events, want)
	}
	return res
}

// bulkCopies inserts copies from to to-1 of copy 0 ("c0-<olist id>")
// into events and returns the number of events inserted. Each copy is
// copy 0's commits as stored, read once with one Find, with the copy's
// stream id, commit id and idempotency key, new event, correlation and
// causation ids (equal where copy 0's are) and recorded_at the time of
// the insert, and from copy customerCopies on, customer ids with the
// suffix "-g<copy/customerCopies>"; everything else, the payloads
// included, is copy 0's. The
// commits go in with ordered InsertMany calls of rebuildBulk documents,
// rebuildBulkWriters at a time, through the store's normal collection and
// indexes.
func bulkCopies(ctx context.Context, b *testing.B, events *mongo.Collection, from, to int) int64 {
	b.Helper()
	cur, err := events.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: "c0-"}, {Key: "$lt", Value: "c0."}}}})
	if err != nil {
		b.Fatalf("read copy 0: %v", err)
	}
	var tpl []bson.D
	if err := cur.All(ctx, &tpl); err != nil {
		b.Fatalf("read copy 0: %v", err)
	}
	if len(tpl) == 0 {
		b.Fatalf("copy 0 has no commits")
	}
	perCopy := int64(0)
	for _, c := range tpl {
		perCopy += int64(len(field[bson.A](b, c, "events")))
	}

	batches := make(chan []any)
	var (
		wg       sync.WaitGroup
		failed   atomic.Bool
		inserted atomic.Int64
	)
	for range rebuildBulkWriters {
		wg.Go(func() {
			for docs := range batches {
				if failed.Load() {
					continue
				}
				res, err := events.InsertMany(ctx, docs)
				if err != nil {
					failed.Store(true)
					b.Errorf("InsertMany of %d copied commits: %v", len(docs), err)
					continue
				}
				inserted.Add(int64(len(res.InsertedIDs)))
			}
		})
	}
	batch := make([]any, 0, rebuildBulk)
	lastNote := time.Now()
	for n := from; n < to && !failed.Load() && ctx.Err() == nil; n++ {
		prefix, customer := fmt.Sprintf("c%d-", n), ""
		if n >= customerCopies {
			customer = fmt.Sprintf("-g%d", n/customerCopies)
		}
		for _, c := range tpl {
			batch = append(batch, copyCommit(b, c, prefix, customer))
			if len(batch) == rebuildBulk {
				batches <- batch
				batch = make([]any, 0, rebuildBulk)
			}
		}
		if time.Since(lastNote) >= 30*time.Second {
			lastNote = time.Now()
			progressf("bulk copies: %d of %d commits inserted", inserted.Load(), int64(to-from)*int64(len(tpl)))
		}
	}
	if len(batch) > 0 && !failed.Load() {
		batches <- batch
	}
	close(batches)
	wg.Wait()
	if failed.Load() || ctx.Err() != nil {
		b.Fatalf("bulk copies: %d commits inserted (%v)", inserted.Load(), ctx.Err())
	}
	if want := int64(to-from) * int64(len(tpl)); inserted.Load() != want {
		b.Fatalf("bulk copies inserted %d commits, want %d", inserted.Load(), want)
	}
	return int64(to-from) * perCopy
}

// customerCopies is how many copies of the sample share its customers:
// an Olist customer has one order, so a customer has at most this many
// at any size of the log, as in a shop that grows by its customers, and
// a customer's reads measure the index, not a customer ever larger.
const customerCopies = 7

// copyCommit is commit c of copy 0 as copy prefix ("c<copy>-") stores
// it, each customer id with suffix customer: see bulkCopies.
func copyCommit(b *testing.B, c bson.D, prefix, customer string) bson.D {
	oldStream := field[string](b, c, "stream_id")
	stream := prefix + strings.TrimPrefix(oldStream, "c0-")
	now := time.Now().UTC().Truncate(time.Millisecond)
	ids := map[string]string{} // copy 0's uuids to the copy's
	newID := func(old string) string {
		if old == "" {
			return ""
		}
		if id, ok := ids[old]; ok {
			return id
		}
		ids[old] = uuid.Must(uuid.NewV7()).String()
		return ids[old]
	}
	out := make(bson.D, 0, len(c))
	for _, e := range c {
		switch e.Key {
		case "_id":
			e.Value = mongodb.CommitID(stream, field[int64](b, c, "first_version"))
		case "stream_id":
			e.Value = stream
		case "idempotency_key":
			e.Value = strings.Replace(e.Value.(string), oldStream, stream, 1)
		case "recorded_at":
			e.Value = now
		case "events":
			evs := e.Value.(bson.A)
			copied := make(bson.A, len(evs))
			for i, ev := range evs {
				d := slices.Clone(ev.(bson.D))
				for k := range d {
					switch d[k].Key {
					case "event_id", "correlation_id", "causation_id":
						d[k].Value = newID(d[k].Value.(string))
					case "recorded_at":
						d[k].Value = now
					case "data":
						if data, ok := d[k].Value.(bson.D); ok && customer != "" {
							data = slices.Clone(data)
							for j := range data {
								if data[j].Key == "customer_id" {
									data[j].Value = data[j].Value.(string) + customer
								}
							}
							d[k].Value = data
						}
					}
				}
				copied[i] = d
			}
			e.Value = copied
		}
		out = append(out, e)
	}
	return out
}

// field is the value of key in d, of type T; it fails the benchmark when
// d has no such field.
func field[T any](b *testing.B, d bson.D, key string) T {
	for _, e := range d {
		if e.Key == key {
			if v, ok := e.Value.(T); ok {
				return v
			}
			b.Fatalf("field %s of %v is a %T", key, d, e.Value)
		}
	}
	b.Fatalf("no field %s in %v", key, d)
	panic("unreachable")
}

// parsePartitions reads a comma-separated list of partition counts
// (1..64 each).
func parsePartitions(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("%q: want partition counts 1..64, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// scanResult is one raw scan of the log.
type scanResult struct {
	docs, events int64
	elapsed      time.Duration
	rss          phaseRSS
}

func (s scanResult) rate() float64 { return float64(s.events) / s.elapsed.Seconds() }

// rawScan reads every commit of coll with one Find, in batches of
// rebuildScanBatch, sorted by _id when sorted is set, decoding each to
// bson.Raw and counting its events.
func rawScan(ctx context.Context, b *testing.B, coll *mongo.Collection, sorted bool) scanResult {
	b.Helper()
	var res scanResult
	resetPeakRSS()
	res.rss.before = currentRSS()
	opts := options.Find().SetBatchSize(rebuildScanBatch)
	if sorted {
		opts.SetSort(bson.D{{Key: "_id", Value: 1}})
	}
	start := time.Now()
	cur, err := coll.Find(ctx, bson.D{}, opts)
	if err != nil {
		b.Fatalf("scan %s (sorted %v): %v", coll.Name(), sorted, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		var doc bson.Raw
		if err := cur.Decode(&doc); err != nil {
			b.Fatalf("scan %s: decode: %v", coll.Name(), err)
		}
		evs, ok := doc.Lookup("events").ArrayOK()
		if !ok {
			b.Fatalf("scan %s: commit without an events array: %s", coll.Name(), doc)
		}
		vals, err := evs.Values()
		if err != nil {
			b.Fatalf("scan %s: events: %v", coll.Name(), err)
		}
		res.docs++
		res.events += int64(len(vals))
	}
	if err := cur.Err(); err != nil {
		b.Fatalf("scan %s: %v", coll.Name(), err)
	}
	res.elapsed = time.Since(start)
	res.rss.peak = peakRSS()
	progressf("raw scan (sorted %v): %d events in %v", sorted, res.events, res.elapsed.Round(100*time.Millisecond))
	return res
}

// rebuildRun is one rebuild job as it ended.
type rebuildRun struct {
	partitions int
	job        jobs.Job
	parts      []jobs.Task
	elapsed    time.Duration // StartRebuild called to the job's finished_at
	create     time.Duration // StartRebuild: lock, tasks, pointer
	plan       time.Duration // the plan task: commit count and partition bounds
	queued     time.Duration // StartRebuild returned to the first partition claimed
	scan       time.Duration // first partition claimed to the last one done
	handoff    time.Duration // last partition done to the finish task claimed
	finish     time.Duration // the finish task: verify against the scan's sums, and switch
	rss        phaseRSS
}

func (r rebuildRun) rate() float64 { return float64(r.job.Events) / r.elapsed.Seconds() }

// overlap is how long every one of the tasks ran at the same time: 0 when
// one finished before another started.
func overlap(tasks []jobs.Task) time.Duration {
	var start, end time.Time
	for i, t := range tasks {
		if i == 0 || t.StartedAt.After(start) {
			start = t.StartedAt
		}
		if i == 0 || t.FinishedAt.Before(end) {
			end = t.FinishedAt
		}
	}
	return max(0, end.Sub(start))
}

// runRebuild rebuilds projection name in partitions and waits for the job
// to end. It fails the benchmark unless the job succeeded having counted
// events events and orders streams.
func runRebuild(ctx context.Context, b *testing.B, scheduler *jobs.Jobs, name string, partitions int, events int64, orders int) rebuildRun {
	b.Helper()
	r := rebuildRun{partitions: partitions}
	resetPeakRSS()
	r.rss.before = currentRSS()
	start := time.Now()
	job, err := scheduler.StartRebuild(ctx, name, partitions)
	if err != nil {
		b.Fatalf("start a rebuild with %d partition(s): %v", partitions, err)
	}
	r.create = time.Since(start)
	created := time.Now()
	lastNote := start
	for {
		j, err := scheduler.Get(ctx, job.ID)
		if err != nil {
			b.Fatalf("read rebuild %s: %v", job.ID, err)
		}
		if j.State.Final() {
			job = j
			break
		}
		if time.Since(lastNote) >= 30*time.Second {
			lastNote = time.Now()
			progressf("rebuild, %d partition(s): %s, %d of %d events after %v", partitions, j.State, j.Events, events,
				time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			b.Fatalf("rebuild %s with %d partition(s) unfinished after %v: %+v", job.ID, partitions, time.Since(start).Round(time.Second), j)
		case <-time.After(rebuildPollJob):
		}
	}
	r.elapsed = time.Since(start)
	if !job.FinishedAt.IsZero() {
		r.elapsed = job.FinishedAt.Sub(start)
	}
	r.rss.peak = peakRSS()
	r.job = job
	if job.State != jobs.StateSucceeded {
		b.Fatalf("rebuild with %d partition(s) %s: %s", partitions, job.State, job.Error)
	}
	if job.Events != events {
		b.Fatalf("rebuild with %d partition(s) counted %d events; the log holds %d", partitions, job.Events, events)
	}
	if job.Streams != int64(orders) || job.PoisonStreams != 0 {
		b.Errorf("rebuild with %d partition(s) counted %d streams (%d poison); the log holds %d", partitions, job.Streams, job.PoisonStreams, orders)
	}
	if rep := job.Report; rep == nil || rep.Drift() != 0 || rep.Events != events {
		b.Errorf("rebuild with %d partition(s): verify report %+v; want no drift over %d events", partitions, rep, events)
	}

	var first, last, finishStart time.Time
	for _, t := range job.Tasks {
		switch t.Name {
		case "finish":
			finishStart = t.StartedAt
			r.finish = t.FinishedAt.Sub(t.StartedAt)
			continue
		case "plan":
			r.plan = t.FinishedAt.Sub(t.StartedAt)
			continue
		}
		r.parts = append(r.parts, t)
		if first.IsZero() || t.StartedAt.Before(first) {
			first = t.StartedAt
		}
		if t.FinishedAt.After(last) {
			last = t.FinishedAt
		}
	}
	r.queued, r.scan, r.handoff = first.Sub(created), last.Sub(first), finishStart.Sub(last)
	if len(r.parts) != partitions {
		b.Errorf("rebuild asked for %d partition(s) has %d", partitions, len(r.parts))
	}
	progressf("rebuild, %d partition(s): %s in %v", partitions, job.State, r.elapsed.Round(100*time.Millisecond))
	return r
}

// resetPeakRSS returns free Go memory to the OS, then resets the
// kernel's high-water mark of the process's RSS (Linux: 5 written to
// /proc/self/clear_refs). It reports whether the reset was accepted.
func resetPeakRSS() bool {
	debug.FreeOSMemory()
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSS is VmHWM of /proc/self/status in bytes (0 when unreadable).
func peakRSS() int64 { return procStatus("VmHWM:") }

// currentRSS is VmRSS of /proc/self/status in bytes (0 when unreadable).
func currentRSS() int64 { return procStatus("VmRSS:") }

func procStatus(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// loadAverage is the 1-, 5- and 15-minute load averages of
// /proc/loadavg ("?" when unreadable).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// progressf notes a finished phase on stderr: the benchmark runs for
// minutes.
func progressf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "BenchmarkRebuild: "+format+"\n", args...)
}
