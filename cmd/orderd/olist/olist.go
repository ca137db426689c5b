package olist

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/domain"
)

// Defaults of Main's flags; Run uses them for zero Config fields.
const (
	DefaultData        = "testdata/olist-sample"
	DefaultConcurrency = 8
	DefaultTimeout     = 10 * time.Second
	DefaultCatchUp     = 10 * time.Minute
)

// maxFindings bounds the mismatches and unexpected rejections Print lists.
const maxFindings = 10

// Config configures Run. Zero Data, URL, Concurrency and Timeout take the
// defaults above; negative numbers are an error.
type Config struct {
	Data        string        // directory of the Olist CSV files
	URL         string        // base URL of the service, e.g. "http://127.0.0.1:8080"
	Concurrency int           // orders imported (and checked) in parallel
	CheckOnly   bool          // send no commands, only check
	Limit       int           // only the first Limit orders by purchase time; 0 = all
	Timeout     time.Duration // bound of each HTTP attempt
	CatchUp     time.Duration // how long the check waits, in all, for read models still behind [10m]
	Progress    io.Writer     // progress bars go here; nil = none
}

// OddOutcome is what the service did with the orders of one odd path:
// Orders counts them, Rejected counts their rejections by reason, Ended
// their final status as the check read it ("" when it could not be read).
type OddOutcome struct {
	Orders   int
	Rejected map[string]int
	Ended    map[domain.Status]int
}

// Report is the result of Run. Orders counts the orders imported, each of
// them checked; Commands counts commands sent (retries of
// one command count once); Replayed counts the accepted ones answered with
// Idempotent-Replayed: true (all of them on a second run); Rejected counts the commands not accepted by
// reason ("ship: invalid-transition"), documented refusals included;
// Unexpected lists the other rejections and Skipped counts the commands
// not sent after them. Odd has an entry for each name of OddPaths. Equal
// counts orders whose read model equals the log fold, StatusOK those in
// the expected final status; Mismatches lists the orders failing any
// check. Unexpected and Mismatches hold one "<order id>: <what>" each, in
// order of purchase. Sales is the check of the daily sales against the
// orders' log folds.
type Report struct {
	Data, URL  string
	CheckOnly  bool
	Orders     int
	Commands   int
	Accepted   int
	Replayed   int
	Rejected   map[string]int
	Unexpected []string
	Skipped    int
	Odd        map[string]*OddOutcome
	Equal      int
	StatusOK   int
	Mismatches []string
	Sales      SalesCheck
	SendTime   time.Duration
	CheckTime  time.Duration
}

// Err returns nil when the report has no mismatch (of an order or of the
// daily sales) and no unexpected rejection, else an error counting them.
func (r *Report) Err() error {
	if len(r.Mismatches) == 0 && len(r.Unexpected) == 0 && len(r.Sales.Mismatches) == 0 {
		return nil
	}
	return fmt.Errorf("import-olist: %d mismatches, %d unexpected rejections, %d daily sales mismatches",
		len(r.Mismatches), len(r.Unexpected), len(r.Sales.Mismatches))
}

const usage = `Usage: orderd import-olist [flags]
   or: orderd replay [flags]

Imports the Olist sample orders into a running orderd service as REST
commands, then checks every order: the order folded from the event log
(GET /v1/orders/{id}) must equal its read model (GET /v1/order-summaries/{id})
and end in the dataset's final status (or the documented refusal), and the
daily sales (GET /v1/daily-sales) must equal the sums of those orders.

Start the service first, then run from the repository root, for example:
  orderd import-olist                             every order, to http://127.0.0.1:8080
  orderd import-olist -limit 300 -concurrency 16  the 300 oldest orders, 16 at a time
  orderd import-olist -check-only                 send nothing, check a previous import

Running it again is safe: every command carries an Idempotency-Key, so the
service appends nothing new. The report goes to stdout; the exit status is
non-zero when an order mismatches or a command is rejected unexpectedly.

Flags:
`

// Main runs the import-olist command line: args are the flags (without the
// program name), the report goes to stdout, usage, errors and the progress
// bar to stderr. It returns flag.ErrHelp for -h (a success for the
// caller), the flag or Run error, or Report.Err.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.FlagSet("import-olist", usage, stderr)
	var cfg Config
	var progress bool
	fs.StringVar(&cfg.Data, "data", DefaultData, "`directory` of olist_orders_dataset.csv and olist_order_items_dataset.csv")
	fs.StringVar(&cfg.URL, "url", cli.ServiceURL(os.Getenv), "base `URL` of the orderd service; default: ORDERD_URL, else where ORDERD_HTTP_ADDR makes the server listen")
	fs.IntVar(&cfg.Concurrency, "concurrency", DefaultConcurrency, "how many orders are imported and checked in parallel (each order's commands go one after another)")
	fs.BoolVar(&cfg.CheckOnly, "check-only", false, "send no commands; only check the orders in the service")
	fs.BoolVar(&progress, "progress", true, "show a progress bar on stderr; -progress=false hides it")
	fs.DurationVar(&cfg.Timeout, "timeout", DefaultTimeout, "time limit of each HTTP request")
	fs.IntVar(&cfg.Limit, "limit", 0, "import only the first `N` orders by purchase time; 0 means all")
	fs.DurationVar(&cfg.CatchUp, "catch-up", DefaultCatchUp, "how long the check waits, in all, for read models that are still catching up")
	if err := cli.Parse(fs, args); err != nil {
		return err // flag.ErrHelp for -h
	}
	switch {
	case cfg.Concurrency < 1:
		return errors.New("import-olist: -concurrency must be at least 1")
	case cfg.Timeout <= 0:
		return errors.New("import-olist: -timeout must be positive")
	}
	if progress {
		cfg.Progress = stderr
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("import-olist: %w", err)
	}
	if err := rep.Print(stdout); err != nil {
		return err
	}
	return rep.Err()
}

// Run loads the data, sends every plan (unless CheckOnly), checks every
// order and returns the report. It returns an error only when it cannot do
// that: a bad Config, a load error, or ctx ending. Mismatches and
// rejections are in the Report (see Report.Err).
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.Data = cmp.Or(cfg.Data, DefaultData)
	cfg.URL = strings.TrimRight(cmp.Or(cfg.URL, cli.DefaultServiceURL), "/")
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.CatchUp = cmp.Or(cfg.CatchUp, DefaultCatchUp)
	c, err := newImporter(cfg.URL, cfg.Timeout, cfg.Concurrency)
	if err != nil {
		return Report{}, err
	}
	defer c.tr.CloseIdleConnections()
	if cfg.Concurrency < 0 || cfg.Timeout < 0 || cfg.Limit < 0 {
		return Report{}, errors.New("concurrency, timeout and limit must not be negative")
	}
	ds, err := Load(cfg.Data)
	if err != nil {
		return Report{}, err
	}
	orders := ds.Orders
	if cfg.Limit > 0 && cfg.Limit < len(orders) {
		orders = orders[:cfg.Limit]
	}
	plans := make([]Plan, len(orders))
	for i, o := range orders {
		plans[i] = ds.Plan(o)
	}

	sends := make([][]outcome, len(plans))
	start := time.Now()
	if !cfg.CheckOnly {
		err := parallel(ctx, cfg, "import", len(plans), func(i int) { sends[i] = c.send(ctx, plans[i]) })
		if err != nil {
			return Report{}, err
		}
	}
	sendTime := time.Since(start)
	checks := make([]checked, len(plans))
	start = time.Now()
	c.catchUp = time.Now().Add(cfg.CatchUp)
	if err := parallel(ctx, cfg, "check", len(plans), func(i int) { checks[i] = c.check(ctx, plans[i]) }); err != nil {
		return Report{}, err
	}
	sales := c.checkSales(ctx, checks, len(orders) < len(ds.Orders))
	rep := Report{Data: cfg.Data, URL: cfg.URL, CheckOnly: cfg.CheckOnly, Sales: sales, SendTime: sendTime, CheckTime: time.Since(start)}
	rep.add(plans, sends, checks)
	return rep, nil
}

// parallel calls fn(0..n-1), started in index order, at most
// cfg.Concurrency at a time, with a progress bar on cfg.Progress. It stops
// starting calls when ctx ends and then returns ctx.Err().
func parallel(ctx context.Context, cfg Config, desc string, n int, fn func(i int)) error {
	var bar *progressbar.ProgressBar
	if cfg.Progress != nil {
		bar = progressbar.NewOptions(n, progressbar.OptionSetWriter(cfg.Progress),
			progressbar.OptionSetDescription(desc), progressbar.OptionShowCount(),
			progressbar.OptionShowIts(), progressbar.OptionSetItsString("orders"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(cfg.Progress) }))
	}
	var g errgroup.Group
	g.SetLimit(cfg.Concurrency)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		g.Go(func() error {
			fn(i)
			if bar != nil {
				_ = bar.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait() // fn returns no error
	if bar != nil && ctx.Err() != nil {
		_ = bar.Exit()
	}
	return ctx.Err()
}

// add folds the per-order results into r.
func (r *Report) add(plans []Plan, sends [][]outcome, checks []checked) {
	r.Orders = len(plans)
	r.Rejected, r.Odd = map[string]int{}, map[string]*OddOutcome{}
	for _, name := range OddPaths {
		r.Odd[name] = &OddOutcome{Rejected: map[string]int{}, Ended: map[domain.Status]int{}}
	}
	for i, p := range plans {
		answers, ch := sends[i], checks[i]
		if len(answers) > 0 { // sent: the commands after the last answer were skipped
			r.Skipped += len(p.Commands) - len(answers)
		}
		for _, a := range answers {
			r.Commands++
			if a.reason == "" {
				r.Accepted++
				if a.replayed {
					r.Replayed++
				}
				continue
			}
			r.Rejected[a.reason]++
			if !slices.Contains(p.Refused, a.reason) {
				r.Unexpected = append(r.Unexpected, p.Order.ID+": "+a.reason+": "+a.detail)
			}
		}
		for _, name := range p.Odd {
			oo := r.Odd[name]
			oo.Orders++
			oo.Ended[ch.fold.Status]++
			for _, a := range answers {
				if a.reason != "" {
					oo.Rejected[a.reason]++
				}
			}
		}
		if ch.equal {
			r.Equal++
		}
		if ch.fold.Status == p.Want {
			r.StatusOK++
		}
		if ch.problem != "" {
			r.Mismatches = append(r.Mismatches, p.Order.ID+": "+ch.problem)
		}
	}
}

// Print writes the report as text to w, listing the first 10 findings of each kind.
func (r *Report) Print(w io.Writer) error {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	f("import of %s to %s\n", r.Data, r.URL)
	f("orders          %d\n", r.Orders)
	if r.CheckOnly {
		f("commands        none sent (-check-only)\n")
	} else {
		f("commands sent   %d: accepted %d (idempotent replays %d), rejected %d (unexpected %d), skipped %d\n",
			r.Commands, r.Accepted, r.Replayed, r.Commands-r.Accepted, len(r.Unexpected), r.Skipped)
	}
	if len(r.Rejected) > 0 {
		f("rejected by reason:\n")
		for _, k := range slices.Sorted(maps.Keys(r.Rejected)) {
			f("  %-34s %d\n", k, r.Rejected[k])
		}
	}
	f("odd paths (orders: what the service did):\n")
	for _, name := range OddPaths {
		oo := r.Odd[name]
		if oo == nil {
			continue
		}
		var did []string
		for _, k := range slices.Sorted(maps.Keys(oo.Rejected)) {
			did = append(did, fmt.Sprintf("refused %s %d", k, oo.Rejected[k]))
		}
		for _, k := range slices.Sorted(maps.Keys(oo.Ended)) {
			did = append(did, fmt.Sprintf("ended %s %d", cmp.Or(string(k), "unread"), oo.Ended[k]))
		}
		f("  %-24s %4d  %s\n", name, oo.Orders, cmp.Or(strings.Join(did, ", "), "-"))
	}
	f("check           %d orders: read model equal to the log fold %d, status as expected %d, mismatches %d\n",
		r.Orders, r.Equal, r.StatusOK, len(r.Mismatches))
	for _, m := range firstFindings(r.Mismatches) {
		f("  mismatch  %s\n", m)
	}
	for _, u := range firstFindings(r.Unexpected) {
		f("  unexpected rejection  %s\n", u)
	}
	f("daily sales     %s\n", r.Sales.line())
	for _, m := range firstFindings(r.Sales.Mismatches) {
		f("  mismatch  %s\n", m)
	}
	f("time            send %v (%.0f commands/s), check %v (%.0f orders/s)\n",
		r.SendTime.Round(time.Millisecond), rate(r.Commands, r.SendTime),
		r.CheckTime.Round(time.Millisecond), rate(r.Orders, r.CheckTime))
	if err := r.Err(); err != nil {
		f("result          FAILED: %s\n", strings.TrimPrefix(err.Error(), "import-olist: "))
	} else {
		f("result          OK\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// firstFindings is the head of fs that Print lists.
func firstFindings(fs []string) []string { return fs[:min(len(fs), maxFindings)] }

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
