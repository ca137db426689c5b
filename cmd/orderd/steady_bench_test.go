package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Phases of BenchmarkSteadyLoad.
const (
	steadyBurst     = 10 * time.Second // closed loop: the burst rate the steady phase is a share of
	steadyShare     = 0.8              // of the burst rate, offered in the steady phase
	steadyDuration  = time.Minute
	steadyOverload  = 30 * time.Second // closed loop with twice the clients
	steadyClients   = benchClients
	steadyOpenLoop  = 4 * benchClients // workers of the open-loop phase: enough that the rate, not their latency, paces it
	steadyProbeRate = 10               // every 10th accepted command is followed by a visibility probe...
	steadyProbes    = 8                // ...when fewer than 8 are waiting
)

// BenchmarkSteadyLoad measures whether the read models keep up with what
// the service accepts, against its own embedded Main, in one run:
//
//  1. the store's raw insertOne limit (as BenchmarkService);
//  2. a burst: 32 clients drive orders (place, approve, ship, deliver) as
//     fast as they are answered for 10 s, which gives the burst rate;
//  3. a steady load: commands offered at a fixed 0.8 × the burst rate for
//     a minute (open loop, paced by a token bucket, not by the answers);
//  4. an overload: 64 clients as fast as they are answered for 30 s.
//
// Each phase samples the slowest read model's lag every second
// (orderd_admission_projection_lag), and the relay's: the commits it read
// and JetStream has not yet acknowledged, and the age of the oldest. It
// probes accepted-to-visible latency after every 10th accepted command
// (GET order summary ?min_version, at most 8 waiting), and counts the
// commands refused with 503 read-models-behind (resent after their
// Retry-After). A phase's lag is flat when its least-squares slope over
// the phase's last two thirds, times the phase's length, is less than one
// second of its commands. Run it with -benchtime 1x (make bench).
func BenchmarkSteadyLoad(b *testing.B) {
	m := runMain(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	base := "http://" + m.HTTPAddr
	db := m.mongo.Database(m.Config.Mongo.Database)
	b.ResetTimer()
	raw := measureRawInserts(ctx, b, db.Collection(benchScratch))
	rawRate := float64(benchRawInserts) / raw.elapsed.Seconds()

	// Each phase and the drain after it, with where the store's writer
	// and a command's event spent their time meanwhile.
	hc := &http.Client{Timeout: 10 * time.Second}
	phase := func(name string, workers int, lim *rate.Limiter, d time.Duration) *phaseResult {
		ages0, writes0 := scrapeMetrics(ctx, hc, base), m.StoreWrites()
		p := steadyPhase(ctx, b, m, base, name, workers, lim, d)
		waitCaughtUp(ctx, b, base)
		p.split = writeCosts(writes0, m.StoreWrites(), p.accepted) + hopTable(ages0, scrapeMetrics(ctx, hc, base))
		return p
	}
	burst := phase("burst", steadyClients, nil, steadyBurst)
	steady := phase("steady", steadyOpenLoop, rate.NewLimiter(rate.Limit(steadyShare*burst.rate()), 1), steadyDuration)
	over := phase("overload", 2*steadyClients, nil, steadyOverload)
	b.StopTimer()

	b.ReportMetric(rawRate, "raw_inserts/s")
	b.ReportMetric(burst.rate(), "burst_commands/s")
	b.ReportMetric(steady.rate()/burst.rate(), "steady_to_burst")
	b.ReportMetric(steady.slope(), "steady_lag_slope_events/s")
	b.ReportMetric(float64(steady.maxLag()), "steady_max_lag")
	b.ReportMetric(ms(percentile(steady.visible, 99)), "steady_visible_p99_ms")
	b.ReportMetric(float64(over.maxLag()), "overload_max_lag")
	b.ReportMetric(float64(over.paused), "overload_paused")

	var t strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&t, format, args...) }
	f("\nBenchmarkSteadyLoad: embedded FerretDB 1.24 on SQLite + embedded NATS; max lag %d events (ORDERD_MAX_LAG)\n", m.Config.MaxLag)
	f("  raw insertOne, 32 goroutines   %.0f/s\n", rawRate)
	f("  %-9s %8s %9s %9s %8s %8s %8s %8s %8s %10s %10s %6s\n", "phase", "time", "offered/s", "accepted/s", "to raw", "paused", "lag max", "lag end", "slope/s", "visible p50", "visible p99", "busy")
	for _, p := range []*phaseResult{burst, steady, over} {
		off := "-"
		if p.offered > 0 {
			off = fmt.Sprintf("%.0f", p.offered)
		}
		f("  %-9s %8s %9s %10.0f %8.2f %8d %8d %8d %8.1f %10s %10s %6.2f\n", p.name, p.elapsed.Round(time.Second), off, p.rate(), p.rate()/rawRate,
			p.paused, p.maxLag(), p.lastLag(), p.slope(), round(percentile(p.visible, 50)), round(percentile(p.visible, 99)), p.busy)
	}
	f("  steady: %.2f of the burst rate accepted; the lag %s (slope %.1f events/s against %.0f commands/s)\n",
		steady.rate()/burst.rate(), map[bool]string{true: "stayed flat", false: "did not stay flat"}[steady.flat()], steady.slope(), steady.rate())
	f("  lag samples (events, one a second):\n")
	for _, p := range []*phaseResult{burst, steady, over} {
		f("    %-9s %v\n", p.name, p.lags)
	}
	f("  failed commands: burst %d, steady %d, overload %d; probes whose wait ran out: %d, %d, %d\n",
		burst.failed, steady.failed, over.failed, burst.stale, steady.stale, over.stale)
	f("  relay: most commits read and not yet acknowledged %.0f, %.0f, %.0f; its lag at most %.2fs, %.2fs, %.2fs; failed rounds %.0f, %.0f, %.0f\n",
		burst.relayBehind, steady.relayBehind, over.relayBehind, burst.relayLag, steady.relayLag, over.relayLag,
		burst.relayErrors, steady.relayErrors, over.relayErrors)
	for _, p := range []*phaseResult{burst, steady, over} {
		f("  %s phase:\n%s", p.name, p.split)
	}
	fmt.Fprint(os.Stdout, t.String())
	if n := burst.failed + steady.failed + over.failed; n > 0 {
		b.Errorf("%d commands failed", n)
	}
}

// phaseResult is what one phase of BenchmarkSteadyLoad measured.
type phaseResult struct {
	name     string
	offered  float64 // commands/s offered; 0 for a closed loop
	elapsed  time.Duration
	accepted int
	paused   int // 503 read-models-behind answers (each command resent after Retry-After)
	failed   int
	stale    int
	visible  []time.Duration
	lags     []int64 // one a second; -1 when the service had no fresh sample
	busy     float64 // share of the phase the store's writer was busy
	split    string  // the writer's table and the hop table of the phase and its drain

	relayBehind float64 // the most commits the relay had read and JetStream not yet acknowledged (orderd_relay_commits_behind)
	relayLag    float64 // the relay's largest lag seen, in seconds (orderd_relay_lag_seconds)
	relayErrors float64 // the relay's failed rounds during the phase (orderd_relay_publish_errors_total)
}

func (p *phaseResult) rate() float64 { return float64(p.accepted) / p.elapsed.Seconds() }

func (p *phaseResult) maxLag() int64 {
	var n int64
	for _, l := range p.lags {
		n = max(n, l)
	}
	return n
}

func (p *phaseResult) lastLag() int64 {
	if len(p.lags) == 0 {
		return -1
	}
	return p.lags[len(p.lags)-1]
}

// slope is the least-squares slope of the lag, in events per second, over
// the last two thirds of the phase's samples (the first third ramps up).
func (p *phaseResult) slope() float64 {
	var xs, ys []float64
	for i := len(p.lags) / 3; i < len(p.lags); i++ {
		if p.lags[i] >= 0 {
			xs, ys = append(xs, float64(i)), append(ys, float64(p.lags[i]))
		}
	}
	n := float64(len(xs))
	if n < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// flat: over the phase, the lag's slope adds up to less than one second
// of the commands accepted (samples wander by hundreds of events).
func (p *phaseResult) flat() bool { return p.slope()*p.elapsed.Seconds() < p.rate() }

// steadyPhase drives orders from workers goroutines for d: each command
// waits for a token of lim first (an open loop at lim's rate), or, with
// lim nil, goes as soon as the previous one was answered.
func steadyPhase(ctx context.Context, b *testing.B, m *Main, base, name string, workers int, lim *rate.Limiter, d time.Duration) *phaseResult {
	b.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = workers + steadyProbes
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections()
	res := &phaseResult{name: name}
	if lim != nil {
		res.offered = float64(lim.Limit())
	}
	var (
		mu                       sync.Mutex
		accepted, paused, failed atomic.Int64
		probes                   sync.WaitGroup
		slots                    = make(chan struct{}, steadyProbes)
		reported                 atomic.Int64
	)
	errorf := func(format string, args ...any) {
		if reported.Add(1) <= 5 {
			b.Errorf(format, args...)
		}
	}
	phaseCtx, stop := context.WithTimeout(ctx, d)
	defer stop()

	// One lag sample a second until the workers are done.
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-phaseCtx.Done():
				return
			case <-tick.C:
			}
			lag := int64(-1)
			mt := scrapeMetrics(ctx, hc, base)
			if v, ok := mt["orderd_admission_projection_lag"]; ok {
				lag = int64(v)
			}
			mu.Lock()
			res.lags = append(res.lags, lag)
			res.relayBehind = max(res.relayBehind, mt["orderd_relay_commits_behind"])
			res.relayLag = max(res.relayLag, mt["orderd_relay_lag_seconds"])
			mu.Unlock()
		}
	}()

	// send posts one command until it is answered other than 503
	// read-models-behind, and returns its version.
	send := func(path, body string, want int) (int64, time.Time, bool) {
		for {
			if lim != nil && lim.Wait(phaseCtx) != nil {
				return 0, time.Time{}, false
			}
			resp, data, answered, err := post(ctx, hc, base+path, body)
			if err != nil {
				failed.Add(1)
				errorf("%s: POST %s: %v", name, path, err)
				return 0, time.Time{}, false
			}
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(data), "read-models-behind") {
				paused.Add(1)
				secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
				select {
				case <-phaseCtx.Done():
					return 0, time.Time{}, false
				case <-time.After(time.Duration(max(secs, 1)) * time.Second):
				}
				continue
			}
			if resp.StatusCode != want {
				failed.Add(1)
				errorf("%s: POST %s: %d %s", name, path, resp.StatusCode, data)
				return 0, answered, false
			}
			v, _ := strconv.ParseInt(strings.Trim(resp.Header.Get("ETag"), `"`), 10, 64)
			return v, answered, true
		}
	}

	busy0, _ := m.StoreBusy()
	errors0 := scrapeMetrics(ctx, hc, base)["orderd_relay_publish_errors_total"]
	start := time.Now()
	var wg sync.WaitGroup
	var orders atomic.Int64
	for range workers {
		wg.Go(func() {
			for phaseCtx.Err() == nil {
				n := orders.Add(1)
				id := fmt.Sprintf("%s-order-%06d", name, n)
				place := fmt.Sprintf(`{"order_id":%q,"customer_id":"steady-customer-%03d","currency":"BRL","items":[{"sku":"sku-%03d","quantity":%d,"unit_price_cents":%d}],"freight_cents":%d}`,
					id, n%100, n%37, 1+n%3, 990+n, 500)
				for _, s := range []struct {
					path, body string
					want       int
				}{
					{"/v1/orders", place, http.StatusCreated},
					{"/v1/orders/" + id + "/approve", "", http.StatusOK},
					{"/v1/orders/" + id + "/ship", "", http.StatusOK},
					{"/v1/orders/" + id + "/deliver", "", http.StatusOK},
				} {
					v, answered, ok := send(s.path, s.body, s.want)
					if !ok {
						break
					}
					if accepted.Add(1)%steadyProbeRate != 0 {
						continue
					}
					select {
					case slots <- struct{}{}:
						probes.Go(func() {
							defer func() { <-slots }()
							var pr cmdResult
							probe(ctx, hc, base, id, v, answered, &mu, &pr, errorf)
							mu.Lock()
							res.visible, res.stale = append(res.visible, pr.visible...), res.stale+pr.stale
							mu.Unlock()
						})
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	busy1, _ := m.StoreBusy()
	res.busy = (busy1 - busy0).Seconds() / res.elapsed.Seconds()
	res.relayErrors = scrapeMetrics(ctx, hc, base)["orderd_relay_publish_errors_total"] - errors0
	<-sampled
	probes.Wait()
	res.accepted, res.paused, res.failed = int(accepted.Load()), int(paused.Load()), int(failed.Load())
	return res
}

// waitCaughtUp waits until the relay has published every commit it read
// and the read model has applied every event published, so that a phase
// does not start with the last one's lag.
func waitCaughtUp(ctx context.Context, b *testing.B, base string) {
	b.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(benchDrainLimit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		mt := scrapeMetrics(ctx, hc, base)
		if mt != nil && mt["orderd_relay_commits_behind"] == 0 && mt[`orderd_projection_consumer_lag{projection="order_summaries"}`] == 0 &&
			mt["orderd_admission_projection_lag"] == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Errorf("the read model still behind %v after a phase", benchDrainLimit)
}
