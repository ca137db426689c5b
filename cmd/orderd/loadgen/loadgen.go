package loadgen

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderd/orderd/domain"
)

// Defaults of Config's zero fields and of Main's flags.
const (
	defaultURL            = "http://127.0.0.1:8080"
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

// Ack is one acknowledged (2xx) command, as Main's -acks file has it.
type Ack struct {
	OrderID string `json:"order_id"`
	// Command is place, approve, invoice, process, ship, deliver or cancel.
	Command string `json:"command"`
	// Key is the command's Idempotency-Key, also its X-Correlation-ID and
	// so the correlation_id of the event it appended.
	Key string `json:"idempotency_key"`
	// Version is the stream version in the answer: that of the command's
	// event.
	Version int64 `json:"version"`
	// Status is the order status in the answer.
	Status string `json:"status"`
}

// Report is the result of Run. Counts are of logical commands: the
// retries of one command count once, in Retries.
type Report struct {
	Orders   int // orders started
	Commands int // commands sent, each side of a race counting 1 (a race counts 2)
	Acked    int // commands answered 2xx, Idempotent-Replayed included: len(Acks)
	// Refused counts the 4xx (and other non-2xx, non-retried) answers by
	// the last path segment of their problem type ("precondition-failed",
	// "invalid-transition"; "http-<code>" without a problem document).
	Refused    map[string]int
	Races      int // races sent
	RaceWins   int // races where exactly one side was acknowledged
	DoubleWins int // races where both sides were acknowledged: a broken optimistic-concurrency promise; must be 0
	// Unexpected lists what the service must not do, one line each, e.g.
	// "order X: approve: 409 invalid-transition: <detail>": a command
	// outside a race refused; a race side refused with other than 409 or
	// 412; a race refused on both sides; a 2xx whose version is not the
	// order's previous version + 1 or whose status is not the one the
	// command leads to. Must be empty.
	Unexpected []string
	// Unknown lists the idempotency keys of the commands whose outcome is
	// unknown: still failing after RetryFor, or cut short by the context.
	// Their orders were abandoned.
	Unknown []string
	Retries int // HTTP attempts beyond the first of each command
	// Acks lists every acknowledged command, order by order (by order
	// number), each order's in the order sent: a race's side a before b.
	Acks    []Ack
	Elapsed time.Duration
}

// Err returns nil when no race was won by both sides and nothing was
// unexpected, else an error counting both and quoting the first
// unexpected answer. Unknown outcomes are not an error.
func (r *Report) Err() error {
	if r.DoubleWins == 0 && len(r.Unexpected) == 0 {
		return nil
	}
	msg := fmt.Sprintf("loadgen: %d double wins (races acknowledged on both sides), %d unexpected answers", r.DoubleWins, len(r.Unexpected))
	if len(r.Unexpected) > 0 {
		msg += "; first: " + r.Unexpected[0]
	}
	return errors.New(msg)
}

// listed is how many Unexpected and Unknown entries Print shows.
const listed = 10

// Print writes a short aligned summary of r to w: orders, commands, acked,
// refused by type, races, unknown outcomes, retries, elapsed time and
// commands per second, then the first unexpected answers and unknown keys.
// It returns w's error.
func (r *Report) Print(w io.Writer) error {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	f("orders       %d\n", r.Orders)
	f("commands     %d: acked %d, refused %d, unknown %d\n", r.Commands, r.Acked, sum(r.Refused), len(r.Unknown))
	for _, k := range slices.Sorted(maps.Keys(r.Refused)) {
		f("  refused    %-24s %d\n", k, r.Refused[k])
	}
	f("races        %d: won by one side %d, by both sides %d\n", r.Races, r.RaceWins, r.DoubleWins)
	f("retries      %d\n", r.Retries)
	f("elapsed      %v (%.0f commands/s)\n", r.Elapsed.Round(time.Millisecond), rate(r.Commands, r.Elapsed))
	f("unexpected   %d\n", len(r.Unexpected))
	for _, u := range r.Unexpected[:min(len(r.Unexpected), listed)] {
		f("  %s\n", u)
	}
	if len(r.Unknown) > 0 {
		f("unknown      %d (orders abandoned)\n", len(r.Unknown))
		for _, k := range r.Unknown[:min(len(r.Unknown), listed)] {
			f("  %s\n", k)
		}
	}
	if r.Err() != nil {
		f("result       FAILED: %d double wins, %d unexpected\n", r.DoubleWins, len(r.Unexpected))
	} else {
		f("result       OK\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

const usage = `Usage: orderd loadgen [flags]

Drives many orders through their lifecycle over the REST API of running
orderd instances. Each order is placed, then walks a random legal path
(approve, invoice, process, ship, deliver; or a cancel on the way), one
command at a time, each to one of the -url instances. A share of the steps
(-conflicts) is sent as a race: two commands at once with the same If-Match
version, of which exactly one may win. Every command carries an
Idempotency-Key and is retried with it after a transport error or a 5xx, so
a command whose answer was lost still commits once.

It only talks to loopback addresses (127.0.0.0/8, ::1, localhost), and it is
bounded: at most -orders orders, none started after -duration.

Start the service first (orderd serve), then for example:
  orderd loadgen                          200 orders to http://127.0.0.1:8080
  orderd loadgen -orders 5000 -concurrency 32 -duration 5m
  orderd loadgen -url http://127.0.0.1:8080,http://127.0.0.1:8081 -conflicts 0.3 -acks acks.jsonl

Order ids are "<run id>-<n>" (the run id is printed first). -acks writes each
acknowledged command as a JSON line {"order_id", "command",
"idempotency_key", "version", "status"}; each must match exactly one event of
GET /v1/orders/{id}/events, whose metadata.correlation_id is the key.

The report goes to stdout, a progress line per second to stderr. The exit
status is non-zero when a race was won by both sides or an answer was
unexpected (a command refused outside a race, a version that skips).

Flags:
`

// Main runs the loadgen command line: args are the flags (without the
// program name). The run id and the report go to stdout; usage, flag
// errors and progress lines to stderr. It returns flag.ErrHelp for -h (a
// success for the caller), a flag, Config or -acks file error, or
// Report.Err.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	var cfg Config
	var urls, acksFile string
	fs.StringVar(&urls, "url", defaultURL, "comma-separated base `URLs` of the orderd instances (loopback only)")
	fs.IntVar(&cfg.Orders, "orders", defaultOrders, "how many orders to drive, at most")
	fs.DurationVar(&cfg.Duration, "duration", defaultDuration, "start no new order after this `time`; 0 means no time bound")
	fs.IntVar(&cfg.Concurrency, "concurrency", defaultConcurrency, "how many orders are in flight at once")
	fs.Float64Var(&cfg.ConflictRate, "conflicts", defaultConflictRate, "probability, 0 to 1, that a lifecycle step is sent as a race of two commands")
	fs.IntVar(&cfg.Customers, "customers", defaultCustomers, "how many distinct customer ids to spread the orders over")
	fs.Int64Var(&cfg.Seed, "seed", defaultSeed, "seed of the random choices (items, paths, races, URLs)")
	fs.StringVar(&cfg.RunID, "run-id", "", "`prefix` of order ids and idempotency keys (letters, digits, - _); default: random")
	fs.DurationVar(&cfg.RetryFor, "retry-for", defaultRetryFor, "how long one command is retried after a transport error or a 5xx before its outcome counts as unknown")
	fs.DurationVar(&cfg.RequestTimeout, "timeout", defaultRequestTimeout, "time limit of each HTTP attempt")
	fs.StringVar(&acksFile, "acks", "", "write every acknowledged command to `FILE` as JSON lines")
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp for -h
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("loadgen: unexpected arguments %q (see -h)", fs.Args())
	}
	for u := range strings.SplitSeq(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.URLs = append(cfg.URLs, u)
		}
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	cfg.Progress = stderr
	var acks *os.File
	if acksFile != "" {
		// Created before the run, so a bad path fails before any load.
		f, err := os.Create(acksFile)
		if err != nil {
			return fmt.Errorf("loadgen: -acks: %w", err)
		}
		defer f.Close()
		acks = f
	}
	fmt.Fprintf(stdout, "run id       %s (order ids %s-<n>) against %s\n", cfg.RunID, cfg.RunID, strings.Join(cfg.URLs, ", "))
	rep, err := Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if err := rep.Print(stdout); err != nil {
		return err
	}
	if acks != nil {
		if err := writeAcks(acks, rep.Acks); err != nil {
			return fmt.Errorf("loadgen: -acks: %w", err)
		}
	}
	return rep.Err()
}

// writeAcks writes acks as JSON lines to f and closes it.
func writeAcks(f *os.File, acks []Ack) error {
	enc := json.NewEncoder(f)
	for _, a := range acks {
		if err := enc.Encode(a); err != nil {
			return err
		}
	}
	return f.Close()
}

// newRunID returns 8 random hex digits.
func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
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
	c := newClient(cfg)
	defer c.close()
	d := &driver{cfg: cfg, c: c, width: len(strconv.Itoa(cfg.Orders))}
	if cfg.Progress != nil {
		d.log = &lockedWriter{w: cfg.Progress}
	}
	start := time.Now()
	stopProgress := d.progress(start)

	var (
		mu      sync.Mutex
		results []*orderResult
		wg      sync.WaitGroup
		next    = make(chan int)
	)
	for range min(cfg.Concurrency, cfg.Orders) {
		wg.Go(func() {
			for n := range next {
				r := d.drive(ctx, n)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				d.done.Add(1)
			}
		})
	}
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	started := 0
feed:
	for n := 1; n <= cfg.Orders; n++ {
		select { // bounds first: a ready worker must not win a tie
		case <-ctx.Done():
			break feed
		case <-deadline:
			break feed
		default:
		}
		select {
		case next <- n:
			started++
			d.started.Add(1)
		case <-ctx.Done():
			break feed
		case <-deadline:
			break feed
		}
	}
	close(next)
	wg.Wait()
	stopProgress()

	slices.SortFunc(results, func(a, b *orderResult) int { return a.n - b.n })
	rep := Report{Orders: started, Refused: map[string]int{}, Elapsed: time.Since(start)}
	for _, r := range results {
		rep.Commands += r.commands
		rep.Races += r.races
		rep.RaceWins += r.raceWins
		rep.DoubleWins += r.doubleWins
		rep.Retries += r.retries
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

// driver sends the orders of one Run. Its counters feed the progress line.
type driver struct {
	cfg   Config
	c     *client
	width int           // digits of the order number
	log   *lockedWriter // nil without cfg.Progress

	started, done, commands, acked, refused, unknown, retries, races atomic.Int64
}

// lockedWriter serializes the lines written by the orders' goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (d *driver) logf(format string, args ...any) {
	if d.log == nil {
		return
	}
	d.log.mu.Lock()
	defer d.log.mu.Unlock()
	fmt.Fprintf(d.log.w, "loadgen: "+format+"\n", args...)
}

// progress writes a progress line every second until the returned func
// is called.
func (d *driver) progress(start time.Time) (stop func()) {
	if d.log == nil {
		return func() {}
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				d.logf("%3.0fs  orders %d/%d (%d done)  commands %d  acked %d  refused %d  races %d  unknown %d  retries %d",
					time.Since(start).Seconds(), d.started.Load(), d.cfg.Orders, d.done.Load(), d.commands.Load(),
					d.acked.Load(), d.refused.Load(), d.races.Load(), d.unknown.Load(), d.retries.Load())
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// orderResult is what driving one order did.
type orderResult struct {
	n                                              int
	commands, races, raceWins, doubleWins, retries int
	refused                                        map[string]int
	acks                                           []Ack
	unexpected, unknown                            []string
}

// order is the state of an order as its last acknowledged answer has it.
type order struct {
	id      string
	version int64
	status  domain.Status
}

// drive places order n and walks it to a terminal status, or until a
// command is refused or its outcome unknown, or ctx ends.
func (d *driver) drive(ctx context.Context, n int) *orderResult {
	rng := mrand.New(mrand.NewPCG(uint64(d.cfg.Seed), uint64(n)))
	r := &orderResult{n: n, refused: map[string]int{}}
	o := &order{id: fmt.Sprintf("%s-%0*d", d.cfg.RunID, d.width, n)}
	place := step{name: cmdPlace, to: domain.StatusCreated}
	req := request{path: "/v1/orders", body: d.placeBody(rng, o.id), key: o.id + "-" + cmdPlace, ifMatch: -1}
	if !d.single(ctx, rng, r, o, place, req) {
		return r
	}
	for {
		steps := legal[o.status]
		if len(steps) == 0 || ctx.Err() != nil {
			return r
		}
		var goOn bool
		if rng.Float64() < d.cfg.ConflictRate {
			goOn = d.race(ctx, rng, r, o, steps)
		} else {
			s := draw(rng, steps)
			goOn = d.single(ctx, rng, r, o, s, d.stepRequest(o.id, s.name, "", -1))
		}
		if !goOn {
			return r
		}
	}
}

// placeRequest is the body of POST /v1/orders; amounts are BRL cents.
type placeRequest struct {
	OrderID      string        `json:"order_id"`
	CustomerID   string        `json:"customer_id"`
	Currency     string        `json:"currency"`
	Items        []itemRequest `json:"items"`
	FreightCents int64         `json:"freight_cents"`
}

type itemRequest struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// placeBody draws the customer and 1 to 3 lines of order id.
func (d *driver) placeBody(rng *mrand.Rand, id string) []byte {
	p := placeRequest{OrderID: id, CustomerID: fmt.Sprintf("lg-cust-%d", 1+rng.IntN(d.cfg.Customers)),
		Currency: "BRL", FreightCents: int64(rng.IntN(3001))}
	for i := range 1 + rng.IntN(3) {
		p.Items = append(p.Items, itemRequest{SKU: fmt.Sprintf("lg-sku-%d-%d", i+1, 1+rng.IntN(50)),
			Quantity: int64(1 + rng.IntN(5)), UnitPriceCents: int64(100 + rng.IntN(50000))})
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // impossible for this type
	}
	return b
}

// stepRequest is the request of lifecycle command name on order id; side
// is "" outside a race, else "a" or "b"; ifMatch is -1 for none.
func (d *driver) stepRequest(id, name, side string, ifMatch int64) request {
	body := []byte(`{}`)
	if name == domain.CommandName(domain.Cancel{}) {
		body = []byte(`{"reason":"` + cancelReason + `"}`)
	}
	key := id + "-" + name
	if side != "" {
		key += "-" + side
	}
	return request{path: "/v1/orders/" + id + "/" + name, body: body, key: key, ifMatch: ifMatch}
}

// url draws the index of one of the URLs.
func (d *driver) url(rng *mrand.Rand) int { return rng.IntN(len(d.cfg.URLs)) }

// urlPair draws the indexes of two different URLs, or of the only one
// twice.
func (d *driver) urlPair(rng *mrand.Rand) (int, int) {
	n := len(d.cfg.URLs)
	i := rng.IntN(n)
	if n == 1 {
		return i, i
	}
	return i, (i + 1 + rng.IntN(n-1)) % n
}

// count adds one sent command's answer to the counters of r and d.
func (d *driver) count(r *orderResult, a answer) {
	r.commands++
	d.commands.Add(1)
	if a.attempts > 1 {
		r.retries += a.attempts - 1
		d.retries.Add(int64(a.attempts - 1))
	}
	switch a.outcome {
	case acked:
		d.acked.Add(1)
	case refused:
		d.refused.Add(1)
		r.refused[a.reason]++
	case unknown:
		d.unknown.Add(1)
	}
}

// ack records an acknowledged command.
func (r *orderResult) ack(o *order, name string, req request, a answer) {
	r.acks = append(r.acks, Ack{OrderID: o.id, Command: name, Key: req.key, Version: a.version, Status: a.status})
}

// follow checks an acknowledged answer of step s against o's last state,
// then moves o to the answer's state.
func (r *orderResult) follow(o *order, s step, a answer) {
	switch {
	case a.malformedAnswer:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: %d with a body that is not a command answer: %s", o.id, s.name, a.code, a.detail))
	case a.version != o.version+1:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: %d with version %d after version %d, want %d", o.id, s.name, a.code, a.version, o.version, o.version+1))
	case domain.Status(a.status) != s.to:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: %d with status %q, want %q", o.id, s.name, a.code, a.status, s.to))
	}
	o.version, o.status = a.version, domain.Status(a.status)
}

// single sends one command on its own and reports whether the order goes
// on: only after an acknowledgement.
func (d *driver) single(ctx context.Context, rng *mrand.Rand, r *orderResult, o *order, s step, req request) bool {
	a := d.c.send(ctx, d.url(rng), req)
	if a.attempts == 0 {
		return false // ctx ended before it was sent: nothing to count
	}
	d.count(r, a)
	switch a.outcome {
	case acked:
		r.ack(o, s.name, req, a)
		r.follow(o, s, a)
		return true
	case refused:
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: %d %s: %s", o.id, s.name, a.code, a.reason, a.detail))
	default:
		r.unknown = append(r.unknown, req.key)
		d.logf("order %s: %s: outcome unknown (key %s): %s", o.id, s.name, req.key, a.detail)
	}
	return false
}

// race sends two commands legal in o's status at once, both with If-Match
// o's version, and reports whether the order goes on: only when exactly
// one side was acknowledged and the other refused.
func (d *driver) race(ctx context.Context, rng *mrand.Rand, r *orderResult, o *order, steps []step) bool {
	sa, sb := drawPair(rng, steps)
	ua, ub := d.urlPair(rng)
	sides := [2]struct {
		s   step
		req request
		a   answer
	}{
		{s: sa, req: d.stepRequest(o.id, sa.name, "a", o.version)},
		{s: sb, req: d.stepRequest(o.id, sb.name, "b", o.version)},
	}
	var wg sync.WaitGroup
	wg.Go(func() { sides[0].a = d.c.send(ctx, ua, sides[0].req) })
	wg.Go(func() { sides[1].a = d.c.send(ctx, ub, sides[1].req) })
	wg.Wait()
	if sides[0].a.attempts == 0 || sides[1].a.attempts == 0 {
		// ctx ended before a side was sent: no race. A side that was sent
		// still counts.
		for _, x := range sides {
			if x.a.attempts == 0 {
				continue
			}
			d.count(r, x.a)
			switch x.a.outcome {
			case acked:
				r.ack(o, x.s.name, x.req, x.a)
			case unknown:
				r.unknown = append(r.unknown, x.req.key)
			}
		}
		return false
	}
	r.races++
	d.races.Add(1)
	var won []int
	unknowns := 0
	for i, x := range sides {
		d.count(r, x.a)
		switch x.a.outcome {
		case acked:
			r.ack(o, x.s.name, x.req, x.a)
			won = append(won, i)
		case refused:
			if x.a.code != 409 && x.a.code != 412 {
				r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s (race at version %d): %d %s: %s", o.id, x.s.name, o.version, x.a.code, x.a.reason, x.a.detail))
			}
		default:
			unknowns++
			r.unknown = append(r.unknown, x.req.key)
			d.logf("order %s: %s (race at version %d): outcome unknown (key %s): %s", o.id, x.s.name, o.version, x.req.key, x.a.detail)
		}
	}
	what := fmt.Sprintf("race %s/%s at version %d", sa.name, sb.name, o.version)
	switch len(won) {
	case 2:
		r.doubleWins++
		d.logf("order %s: %s: DOUBLE WIN: %s v%d %s and %s v%d %s", o.id, what,
			sa.name, sides[0].a.version, sides[0].a.status, sb.name, sides[1].a.version, sides[1].a.status)
		return false
	case 1:
		r.raceWins++
		w := sides[won[0]]
		r.follow(o, w.s, w.a)
		return unknowns == 0
	}
	if unknowns == 0 {
		r.unexpected = append(r.unexpected, fmt.Sprintf("order %s: %s: neither side acknowledged: %d %s, %d %s",
			o.id, what, sides[0].a.code, sides[0].a.reason, sides[1].a.code, sides[1].a.reason))
	}
	return false
}
