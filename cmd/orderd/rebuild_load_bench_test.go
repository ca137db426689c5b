package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/internal/pause"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
)

// Sizes and settings of BenchmarkRebuildUnderLoad.
const (
	underLoadOrders = 500              // Olist orders replayed before the load
	underLoadWarmUp = 5 * time.Second  // load before the rebuild starts
	underLoadGoal   = 2 * time.Minute  // issue 9's goal for the rebuild
	underLoadBound  = 10 * time.Minute // longest wait for the rebuild
	underLoadPoll   = time.Second      // how often the job is read
	underLoadSeen   = 200              // loadgen orders the reader polls per round, at most
	underLoadToken  = "bench-admin-token"
)

var underLoadClients = flag.Int("rebuild.load-clients", 2,
	"BenchmarkRebuildUnderLoad: loadgen concurrency, orders driven at once while the rebuild runs")

// BenchmarkRebuildUnderLoad measures a full rebuild of order_summaries
// while clients keep sending commands, on one Main booted as `make run`
// boots it (every role, embedded FerretDB and NATS, the default settings:
// 4 job tasks at a time, no settle, 500 streams per checkpoint), in one
// run:
//
//  1. setup, not timed: the first 500 Olist orders by purchase time are
//     imported through the REST API (olist.Run, which also checks that
//     each read model equals the fold of its log);
//  2. 2 loadgen clients (Concurrency 2, one API, no races; another count
//     with -rebuild.load-clients) drive new orders through their
//     lifecycle, from 5 s before the rebuild to its end;
//  3. a reader polls GET /v1/order-summaries/{id} in rounds: every
//     replayed order, and up to 200 loadgen orders it has already seen
//     plus the next 10 it has not. A 404 of an order it has seen, or a
//     version (X-Read-Model-Version) below one it has seen, is a
//     violation (invariant 5); the benchmark fails on any;
//  4. the rebuild: POST /v1/admin/projections/order_summaries/rebuilds
//     (1 partition), then GET of the job every second until it ends or
//     10 minutes pass. Its time runs from the POST to the job's
//     finished_at.
//
// Then the load stops, and the raw scan rate of the log is measured as in
// BenchmarkRebuild (rawScan: Find({}), bson.Raw, batches of 512), on the
// quiet store. It prints the rebuild's time and its ratio to the goal of 2
// minutes, the events it rebuilt and their rate against the raw scan, the
// commands acknowledged meanwhile (orderd_commands_total{outcome=
// "accepted"} between the POST and the end), the reads and violations,
// and where the job's time went (plan and claim, scan, finish:
// verify with repair and switch). A rebuild that does not end within the
// bound fails the benchmark after printing how far it got. Run it with
// -benchtime 1x; it does its fixed work once whatever b.N is.
func BenchmarkRebuildUnderLoad(b *testing.B) {
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), underLoadBound+10*time.Minute)
	defer cancel()
	loadStart := loadAverage()
	m := runMainDir(b, b.TempDir(), func(c *Config) { c.HTTP.AdminToken = underLoadToken })
	base := "http://" + m.HTTPAddr
	hc := &http.Client{Timeout: 30 * time.Second}

	replayStart := time.Now()
	rep, err := olist.Run(ctx, olist.Config{Data: rebuildSample, URL: base, Limit: underLoadOrders})
	if err != nil {
		b.Fatalf("replay of %d Olist orders: %v", underLoadOrders, err)
	}
	if err := rep.Err(); err != nil || rep.Orders != underLoadOrders || rep.Equal != underLoadOrders {
		var out bytes.Buffer
		_ = rep.Print(&out)
		b.Fatalf("replay of %d Olist orders: %v\n%s", underLoadOrders, err, out.String())
	}
	replayed := time.Since(replayStart)
	olistIDs := make([]string, 0, underLoadOrders)
	ds, err := olist.Load(rebuildSample)
	if err != nil {
		b.Fatal(err)
	}
	for _, o := range ds.Orders[:underLoadOrders] {
		olistIDs = append(olistIDs, o.ID)
	}
	underLoadNote("replayed %d orders (%d commands) in %v", rep.Orders, rep.Commands, replayed.Round(time.Second))

	const runID = "ul"
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var (
		wg      sync.WaitGroup
		lg      loadgen.Report
		lgErr   error
		readers readerResult
	)
	wg.Go(func() {
		lg, lgErr = loadgen.Run(loadCtx, loadgen.Config{URLs: []string{base}, Orders: 999_999, Concurrency: *underLoadClients,
			RunID: runID, Seed: 1, RetryFor: 10 * time.Second})
	})
	wg.Go(func() { readers = readSummaries(loadCtx, hc, base, olistIDs, runID, 999_999) })
	pause.For(loadCtx, underLoadWarmUp)

	before := scrapeMetrics(ctx, hc, base)
	b.StartTimer()
	start := time.Now()
	var job jobs.Job
	if code, body := adminDo(ctx, hc, "POST", base+"/v1/admin/projections/order_summaries/rebuilds", `{"partitions":1}`); code != http.StatusAccepted {
		b.Fatalf("start the rebuild: %d %s", code, body)
	} else if err := json.Unmarshal(body, &job); err != nil {
		b.Fatalf("start the rebuild: %v: %s", err, body)
	}
	finished := false
	lastNote := start
	for time.Since(start) < underLoadBound {
		code, body := adminDo(ctx, hc, "GET", base+"/v1/admin/projections/order_summaries/rebuilds/"+job.ID, "")
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &job); err != nil {
				b.Fatalf("read the rebuild: %v: %s", err, body)
			}
		}
		if job.State.Final() {
			finished = true
			break
		}
		if time.Since(lastNote) >= 30*time.Second {
			lastNote = time.Now()
			underLoadNote("after %v: %s, %d events, %d streams%s", time.Since(start).Round(time.Second), job.State, job.Events, job.Streams, taskLine(job))
		}
		pause.For(ctx, underLoadPoll)
	}
	elapsed := time.Since(start)
	if finished && !job.FinishedAt.IsZero() {
		elapsed = job.FinishedAt.Sub(start)
	}
	b.StopTimer()
	after := scrapeMetrics(ctx, hc, base)
	stopLoad()
	wg.Wait()
	if lgErr != nil {
		b.Errorf("loadgen: %v", lgErr)
	}

	// The job ends before its finish task records its own end.
	if code, body := adminDo(ctx, hc, "GET", base+"/v1/admin/projections/order_summaries/rebuilds/"+job.ID, ""); code == http.StatusOK && finished {
		var j jobs.Job
		if json.Unmarshal(body, &j) == nil {
			job.Tasks = j.Tasks
		}
	}
	db := m.mongo.Database(m.Config.Mongo.Database)
	raw := rawScan(ctx, b, db.Collection(mongodb.CommitsCollection), false)

	const accepted = `outcome="accepted"`
	acked := sumMetric(after, "orderd_commands_total", accepted) - sumMetric(before, "orderd_commands_total", accepted)
	rate := float64(job.Events) / elapsed.Seconds()
	b.ReportMetric(elapsed.Seconds(), "rebuild_s")
	b.ReportMetric(elapsed.Seconds()/underLoadGoal.Seconds(), "rebuild_to_goal")
	b.ReportMetric(float64(job.Events), "rebuild_events")
	b.ReportMetric(rate, "rebuild_events/s")
	b.ReportMetric(raw.rate(), "raw_scan_events/s")
	b.ReportMetric(rate/raw.rate(), "ratio_to_raw_scan")
	b.ReportMetric(acked, "commands_acked_meanwhile")
	b.ReportMetric(float64(readers.reads), "reads")

	var t strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&t, format, args...) }
	f("\nBenchmarkRebuildUnderLoad: every role in one process, embedded FerretDB 1.24 on SQLite + embedded NATS, default settings\n")
	f("  setup                             %d Olist orders replayed (%d commands) in %v; read models checked equal to the log\n",
		rep.Orders, rep.Commands, replayed.Round(time.Second))
	if finished {
		f("  rebuild of order_summaries        %s in %v (%.2f of the %v goal)\n", job.State, elapsed.Round(100*time.Millisecond),
			elapsed.Seconds()/underLoadGoal.Seconds(), underLoadGoal)
	} else {
		f("  rebuild of order_summaries        NOT FINISHED after %v (%.2f of the %v goal): %s\n", elapsed.Round(time.Second),
			elapsed.Seconds()/underLoadGoal.Seconds(), underLoadGoal, job.State)
	}
	f("  events rebuilt (the scan)         %d in %d streams, %.0f events/s; raw scan of the log %.0f events/s (%d events, quiet store): %.3f\n",
		job.Events, job.Streams, rate, raw.rate(), raw.events, rate/raw.rate())
	f("  commands acknowledged meanwhile   %.0f (%.1f/s, orderd_commands_total accepted, from the POST to the end)\n", acked, acked/elapsed.Seconds())
	f("  load (%2d loadgen clients)         %d orders, %d commands, %d acknowledged, %d refused, %d unknown, %d retries in %v\n",
		*underLoadClients, lg.Orders, lg.Commands, lg.Acked, lg.RefusedTotal(), len(lg.Unknown), lg.Retries, lg.Elapsed.Round(time.Second))
	f("  readers                           %d reads (%d Olist orders and up to %d loadgen orders a round, %d rounds); %d errors;\n",
		readers.reads, len(olistIDs), underLoadSeen, readers.rounds, readers.errors)
	f("                                    violations: %d 404s of a seen order, %d versions going back\n", readers.notFound, readers.backwards)
	for _, v := range readers.examples {
		f("                                      %s\n", v)
	}
	f("  job tasks\n")
	created := job.CreatedAt
	for _, tk := range job.Tasks {
		f("    %-8s %-9s started %8s after the POST, ran %9s; %d events, %d streams, attempts %d%s\n", tk.Name, tk.State,
			offset(tk.StartedAt, created), span(tk.StartedAt, tk.FinishedAt, time.Now()), tk.Events, tk.Streams, tk.Attempts, errNote(tk.Error))
	}
	if r := job.Report; r != nil {
		f("  verify before the switch          %d recorded sums, %d events scanned, %d documents; missing %d, stale %d, different %d, extra %d; repaired %d\n",
			r.Streams, r.Events, r.Documents, r.Missing, r.Stale, r.Different, r.Extra, r.Repaired)
	}
	if lgErr == nil {
		if err := lg.Err(); err != nil {
			f("  loadgen: %v\n", err)
		}
	}
	f("  load average (shared machine, %d CPUs) %s at the start, %s at the end\n", runtime.NumCPU(), loadStart, loadAverage())
	fmt.Fprint(os.Stdout, t.String())

	if !finished {
		b.Fatalf("the rebuild did not end within %v: %s, %d events, %d streams", underLoadBound, job.State, job.Events, job.Streams)
	}
	if job.State != jobs.StateSucceeded {
		b.Fatalf("the rebuild %s: %s", job.State, job.Error)
	}
	if readers.notFound > 0 || readers.backwards > 0 {
		b.Fatalf("readers saw %d 404s of seen orders and %d versions going back", readers.notFound, readers.backwards)
	}
	if readers.reads == 0 {
		b.Fatal("the reader read nothing")
	}
}

// readerResult is what readSummaries saw.
type readerResult struct {
	reads, rounds, errors int
	notFound, backwards   int      // violations
	examples              []string // the first few violations
}

// readSummaries polls order summaries until ctx ends, in rounds: every
// id of olist, then up to underLoadSeen loadgen orders ("<runID>-<n>",
// n zero-padded to the width of orders) already seen (round-robin) and
// the next 10 not seen yet. It counts a 404 of an order it has seen, or a
// version below the highest it saw, as a violation.
func readSummaries(ctx context.Context, hc *http.Client, base string, olist []string, runID string, orders int) readerResult {
	var res readerResult
	width := len(strconv.Itoa(orders))
	seen := map[string]int64{}
	for _, id := range olist {
		seen[id] = 0
	}
	known := 0 // loadgen orders 1..known have been seen
	next := 0  // round-robin position among them
	read := func(id string) {
		req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/order-summaries/"+id, nil)
		if err != nil {
			return
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				res.errors++
			}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		res.reads++
		last, wasSeen := seen[id]
		violate := func(format string, args ...any) {
			if len(res.examples) < 5 {
				res.examples = append(res.examples, fmt.Sprintf(format, args...))
			}
		}
		switch resp.StatusCode {
		case http.StatusOK:
			v, err := strconv.ParseInt(resp.Header.Get("X-Read-Model-Version"), 10, 64)
			if err != nil {
				res.errors++
				return
			}
			if v < last {
				res.backwards++
				violate("%s at version %d after %d, %s", id, v, last, time.Now().Format(time.TimeOnly))
			}
			seen[id] = max(v, last)
		case http.StatusNotFound:
			if wasSeen {
				res.notFound++
				violate("%s: 404 after version %d, %s", id, last, time.Now().Format(time.TimeOnly))
			}
		default:
			res.errors++
		}
	}
	lgID := func(n int) string { return fmt.Sprintf("%s-%0*d", runID, width, n) }
	for ctx.Err() == nil {
		res.rounds++
		for _, id := range olist {
			read(id)
		}
		for range min(known, underLoadSeen) {
			next = next%known + 1
			read(lgID(next))
		}
		for n := known + 1; n <= known+10 && ctx.Err() == nil; n++ {
			read(lgID(n))
		}
		for {
			if _, ok := seen[lgID(known+1)]; !ok {
				break
			}
			known++
		}
	}
	return res
}

// adminDo sends an admin request with the benchmark's token and returns
// the status and body (0 and the error text when it could not be sent).
func adminDo(ctx context.Context, hc *http.Client, method, url, body string) (int, []byte) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, []byte(err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+underLoadToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// sumMetric adds the series of metric name whose labels contain label.
func sumMetric(ms map[string]float64, name, label string) float64 {
	var sum float64
	for k, v := range ms {
		if strings.HasPrefix(k, name+"{") && strings.Contains(k, label) {
			sum += v
		}
	}
	return sum
}

// taskLine is a job's tasks as "; plan done, part-0 running 1200 events, ...".
func taskLine(j jobs.Job) string {
	var s strings.Builder
	for _, t := range j.Tasks {
		fmt.Fprintf(&s, "; %s %s %d events", t.Name, t.State, t.Events)
	}
	return s.String()
}

// offset is t's time after from, or "-" when t is zero.
func offset(t, from time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Sub(from).Round(100 * time.Millisecond).String()
}

// span is from start to end (to now while end is zero), or "-" when
// start is zero.
func span(start, end, now time.Time) string {
	if start.IsZero() {
		return "-"
	}
	if end.IsZero() {
		return now.Sub(start).Round(100*time.Millisecond).String() + " so far"
	}
	return end.Sub(start).Round(100 * time.Millisecond).String()
}

func errNote(e string) string {
	if e == "" {
		return ""
	}
	return "; error: " + e
}

// underLoadNote notes progress on stderr: the benchmark runs for minutes.
func underLoadNote(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "BenchmarkRebuildUnderLoad: "+format+"\n", args...)
}
