package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
)

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
	fs := cli.FlagSet("loadgen", usage, stderr)
	var cfg Config
	var urls, acksFile string
	fs.StringVar(&urls, "url", cli.ServiceURL(os.Getenv), "comma-separated base `URLs` of the orderd instances (loopback only); default: ORDERD_URL, else where ORDERD_HTTP_ADDR makes the server listen")
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
	if err := cli.Parse(fs, args); err != nil {
		return err // flag.ErrHelp for -h
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
