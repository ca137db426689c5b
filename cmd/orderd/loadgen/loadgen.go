package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/orderd/orderd/domain"
)

// Defaults of Config's zero fields and of Main's flags.
const (
	defaultOrders         = 200
	defaultDuration       = 2 * time.Minute
	defaultConcurrency    = 8
	defaultConflictRate   = 0.1
	defaultCustomers      = 20
	defaultSeed           = 1
	defaultRetryFor       = 30 * time.Second
	defaultRequestTimeout = 10 * time.Second
)

// Config configures Run. It bounds a run by count (Orders) and by time
// (Duration). Zero Concurrency, Customers, RunID, RetryFor and
// RequestTimeout take the defaults given; negative numbers are an error.
type Config struct {
	// URLs are the base URLs of the API instances, e.g.
	// "http://127.0.0.1:8080" (a trailing slash is dropped). At least one;
	// each must be http or https on a loopback host (127.0.0.0/8, ::1,
	// localhost): Run refuses others with an error.
	URLs []string
	// Orders is how many orders to drive, at least 1.
	Orders int
	// Duration: no new order is started after this much time from the
	// start of Run; orders already started are finished. 0: no time bound.
	Duration time.Duration
	// Concurrency is how many orders are in flight at once [8].
	Concurrency int
	// ConflictRate, 0 to 1, is the probability that a lifecycle step (never
	// the place) is sent as a race of two commands (package doc).
	ConflictRate float64
	// Customers is how many distinct customer ids ("lg-cust-<k>", k from 1)
	// the orders are spread over [20].
	Customers int
	// Seed seeds the random choices: items, paths, races and URLs.
	Seed int64
	// RunID prefixes order ids and idempotency keys: order n is
	// "<RunID>-<n>". Letters, digits, '-' and '_', short enough for the
	// order ids to stay within domain.MaxIDLength. Default: 8 random hex
	// digits, new for every run.
	RunID string
	// RetryFor bounds, for one command, the retries after a transport
	// error, a 5xx or a 429: each to the next URL, with backoff 50ms
	// doubling up to 1s; no retry starts later than RetryFor after the
	// first attempt [30s].
	RetryFor time.Duration
	// RequestTimeout bounds each HTTP attempt [10s].
	RequestTimeout time.Duration
	// Progress, when set, gets one progress line per second, and a line
	// for each command whose outcome stayed unknown and each double win.
	Progress io.Writer
}

// check fills in the defaults of cfg and validates it.
func (cfg *Config) check() error {
	if len(cfg.URLs) == 0 {
		return errors.New("no URLs")
	}
	urls := make([]string, len(cfg.URLs))
	for i, u := range cfg.URLs {
		var err error
		if urls[i], err = checkURL(u); err != nil {
			return err
		}
	}
	cfg.URLs = urls
	switch {
	case cfg.Orders < 1:
		return fmt.Errorf("orders %d: want at least 1", cfg.Orders)
	case cfg.Duration < 0:
		return fmt.Errorf("duration %v: must not be negative", cfg.Duration)
	case cfg.Concurrency < 0:
		return fmt.Errorf("concurrency %d: must not be negative", cfg.Concurrency)
	case math.IsNaN(cfg.ConflictRate) || cfg.ConflictRate < 0 || cfg.ConflictRate > 1:
		return fmt.Errorf("conflict rate %v: want 0 to 1", cfg.ConflictRate)
	case cfg.Customers < 0:
		return fmt.Errorf("customers %d: must not be negative", cfg.Customers)
	case cfg.RetryFor < 0:
		return fmt.Errorf("retry-for %v: must not be negative", cfg.RetryFor)
	case cfg.RequestTimeout < 0:
		return fmt.Errorf("request timeout %v: must not be negative", cfg.RequestTimeout)
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaultConcurrency)
	cfg.Customers = cmp.Or(cfg.Customers, defaultCustomers)
	cfg.RetryFor = cmp.Or(cfg.RetryFor, defaultRetryFor)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, defaultRequestTimeout)
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	// The longest order id, "<RunID>-<Orders>", must be a valid id.
	if err := domain.ValidateID("run id", cfg.RunID+"-"+strconv.Itoa(cfg.Orders)); err != nil {
		return fmt.Errorf("run id %q: letters, digits, '-' and '_', at most %d with the order number: %v",
			cfg.RunID, domain.MaxIDLength-1-len(strconv.Itoa(cfg.Orders)), err)
	}
	return nil
}

// Run drives cfg.Orders orders (fewer when cfg.Duration or ctx ends
// first) and returns the report. It returns an error only for a bad Config
// or when ctx had ended before anything ran; per-command failures are in
// the Report (see Report.Err). When ctx ends during the run, Run stops
// starting orders and commands at once, puts the commands then in flight
// in Report.Unknown and returns the report so far with a nil error.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.check(); err != nil {
		return Report{}, err
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	s, err := newSender(cfg)
	if err != nil {
		return Report{}, err
	}
	defer s.tr.CloseIdleConnections()
	d := &driver{cfg: cfg, s: s, width: len(strconv.Itoa(cfg.Orders)), log: log.New(io.Discard, "", 0)}
	if cfg.Progress != nil {
		d.log = log.New(cfg.Progress, "loadgen: ", 0) // a Logger serializes the orders' lines
	}
	start := time.Now()
	stopProgress := d.progress(start)

	// No order starts once ctx or Duration ends; those started finish.
	feed, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	if cfg.Duration > 0 {
		defer time.AfterFunc(cfg.Duration, stopFeed).Stop()
	}
	results := make([]*orderResult, cfg.Orders)
	slots := semaphore.NewWeighted(int64(cfg.Concurrency))
	var wg sync.WaitGroup
	// The bounds are looked at first: a free slot must not win a tie.
	for d.started.Load() < int64(cfg.Orders) && feed.Err() == nil && slots.Acquire(feed, 1) == nil {
		i := int(d.started.Add(1)) - 1
		wg.Go(func() {
			defer slots.Release(1)
			results[i] = d.drive(ctx, i+1)
			d.done.Add(1)
		})
	}
	wg.Wait()
	stopProgress()

	started := int(d.started.Load())
	rep := Report{Orders: started, Refused: map[string]int{}, Elapsed: time.Since(start),
		Commands: int(d.commands.Load()), Races: int(d.races.Load()), RaceWins: int(d.raceWins.Load()),
		DoubleWins: int(d.doubleWins.Load()), Retries: int(d.retries.Load()), Paused: int(d.paused.Load())}
	for _, r := range results[:started] {
		for k, v := range r.refused {
			rep.Refused[k] += v
		}
		rep.Acks = append(rep.Acks, r.acks...)
		rep.Unexpected = append(rep.Unexpected, r.unexpected...)
		rep.Unknown = append(rep.Unknown, r.unknown...)
	}
	rep.Acked = len(rep.Acks)
	return rep, nil
}
