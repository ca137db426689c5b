package loadgen

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

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
	// Paused counts the retries that followed a 503 read-models-behind:
	// the service refused the command unrun while its read models were
	// behind, and the command was sent again after its Retry-After.
	Paused int
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
	f("commands     %d: acked %d, refused %d, unknown %d\n", r.Commands, r.Acked, r.RefusedTotal(), len(r.Unknown))
	for _, k := range slices.Sorted(maps.Keys(r.Refused)) {
		f("  refused    %-24s %d\n", k, r.Refused[k])
	}
	f("races        %d: won by one side %d, by both sides %d\n", r.Races, r.RaceWins, r.DoubleWins)
	f("retries      %d (%d after a pause while the read models were behind)\n", r.Retries, r.Paused)
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

// RefusedTotal is the count of refused commands, whatever the reason.
func (r *Report) RefusedTotal() int {
	n := 0
	for _, v := range r.Refused {
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
