package olist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/pause"
)

// Retry policy of one request: attempts in all, and the first backoff,
// doubled after each retry.
const (
	attempts     = 4
	firstBackoff = 50 * time.Millisecond
)

// valueWidth is how many bytes of a JSON value a diff shows.
const valueWidth = 120

// importer sends the plans to the service and checks the orders there.
type importer struct {
	api     *orderhttp.Client
	tr      *http.Transport
	timeout time.Duration // per attempt, the HTTP client's
	// catchUp is when the check stops waiting for read models that are
	// behind the log (zero: no waiting beyond the server's own bound).
	catchUp time.Time
}

// newImporter returns an importer of the service at base that keeps up to
// conns idle connections; each HTTP attempt is bounded by timeout.
func newImporter(base string, timeout time.Duration, conns int) (*importer, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = conns
	api, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: base, HTTPClient: &http.Client{Transport: tr, Timeout: timeout}})
	if err != nil {
		return nil, err
	}
	return &importer{api: api, tr: tr, timeout: timeout}, nil
}

// retry calls call, each attempt bounded by the timeout, again after no
// answer or a 5xx, with backoff, and after a pause of the commands (503
// read-models-behind) once its Retry-After has passed. It returns the last attempt's error, or
// ctx's when ctx ends while it waits.
func (r *importer) retry(ctx context.Context, call func(ctx context.Context) error) error {
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		err := call(ctx)
		var pe *orderhttp.Error
		again := err != nil && !errors.Is(err, orderhttp.ErrUndecodable) && (!errors.As(err, &pe) || pe.Status >= 500)
		wait := backoff
		if pe != nil && pe.Paused() {
			// Refused unrun while the read models catch up: wait as told,
			// without spending an attempt.
			attempt--
			wait = max(pe.RetryAfter, firstBackoff)
		}
		if !again || attempt == attempts || ctx.Err() != nil {
			return err
		}
		pause.For(ctx, wait)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		backoff *= 2
	}
}

// outcome is the answer to one command: reason is "" when accepted, else
// "<command>: <reason>"; replayed is the Idempotent-Replayed header.
type outcome struct {
	reason, detail string
	replayed       bool
}

// send runs p's commands in order and returns their answers. After a
// rejection that is not in p.Refused it skips the rest.
func (r *importer) send(ctx context.Context, p Plan) []outcome {
	var answers []outcome
	for _, cmd := range p.Commands {
		var res domain.Result
		err := r.retry(ctx, func(ctx context.Context) (err error) {
			res, err = r.api.Execute(ctx, p.Order.ID, cmd, domain.ExecOptions{IdempotencyKey: IdempotencyKey(p.Order.ID, cmd)})
			return err
		})
		var o outcome
		var pe *orderhttp.Error
		name := domain.CommandName(cmd)
		switch {
		case errors.As(err, &pe):
			o = outcome{reason: name + ": " + pe.Slug(), detail: pe.Text()}
		case errors.Is(err, orderhttp.ErrUndecodable):
			o = outcome{reason: name + ": undecodable", detail: err.Error()}
		case err != nil:
			o = outcome{reason: name + ": unreachable", detail: err.Error()}
		default:
			o.replayed = res.Replayed
		}
		answers = append(answers, o)
		if o.reason != "" && !slices.Contains(p.Refused, o.reason) {
			break
		}
	}
	return answers
}

// checked is the check of one order: the log fold (zero when unread, so
// of status ""), whether the read model equals it, and what is wrong (""
// when nothing).
type checked struct {
	fold    domain.Order
	equal   bool
	problem string
}

// check reads the order's log fold and its read model at that version and
// compares them and the status with p.Want.
func (r *importer) check(ctx context.Context, p Plan) checked {
	var ch checked
	var problems []string
	id := p.Order.ID
	var fold domain.Order
	err := r.retry(ctx, func(ctx context.Context) (err error) {
		fold, err = r.api.Order(ctx, id)
		return err
	})
	if err != nil {
		ch.problem = err.Error()
		return ch
	}
	ch.fold = fold
	if fold.Status != p.Want {
		problems = append(problems, fmt.Sprintf("status %s, want %s", fold.Status, p.Want))
	}
	q := orderhttp.SummaryQuery{MinVersion: fold.Version}
	var summary domain.Order
	var stale bool
	readSummary := func(ctx context.Context) (err error) {
		summary, stale, err = r.api.Summary(ctx, id, q)
		return err
	}
	err = r.retry(ctx, readSummary)
	for (err == nil && stale || errors.Is(err, domain.ErrNotFound)) && time.Now().Before(r.catchUp) {
		// The projection is still catching up (behind, or not at the
		// order yet): wait longer, up to the check's overall bound.
		q.Wait = max(min(time.Until(r.catchUp), r.timeout-2*time.Second), time.Second).Round(time.Second)
		err = r.retry(ctx, readSummary)
	}
	switch {
	case err != nil:
		problems = append(problems, err.Error())
	case stale:
		problems = append(problems, fmt.Sprintf("read model stale at version %d, want %d", summary.Version, fold.Version))
	default:
		if d := diff(document(fold), document(summary)); d != "" {
			problems = append(problems, "read model differs from the log fold: "+d)
		} else {
			ch.equal = true
		}
	}
	ch.problem = strings.Join(problems, "; ")
	return ch
}

// document is v (a domain.Order or domain.DailySales) as the JSON object
// the API sends.
func document(v any) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(must(json.Marshal(v)), &m); err != nil {
		panic(err) // impossible: v marshals to an object
	}
	return m
}

// diff names the top-level keys where a and b differ, with both values,
// in key order.
func diff(a, b map[string]any) string {
	keys := slices.AppendSeq(slices.Collect(maps.Keys(a)), maps.Keys(b))
	slices.Sort(keys)
	var out []string
	for _, k := range slices.Compact(keys) {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, fmt.Sprintf("%s: log %s, read model %s", k, jsonText(a[k]), jsonText(b[k])))
		}
	}
	return strings.Join(out, "; ")
}

// jsonText is v as JSON, cut to valueWidth bytes ("..." appended when cut).
func jsonText(v any) string {
	s := string(must(json.Marshal(v)))
	if len(s) > valueWidth {
		return s[:valueWidth] + "..."
	}
	return s
}

// must returns v; err is impossible for the values marshaled here.
func must(v []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return v
}
