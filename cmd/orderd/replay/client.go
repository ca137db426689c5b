package replay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/orderd/orderd/domain"
)

// Retry policy of one request: attempts in all, and the first backoff,
// doubled after each retry.
const (
	attempts     = 4
	firstBackoff = 50 * time.Millisecond
	maxBodyBytes = 1 << 20
)

// client talks to the service. Only this file knows the REST contract.
type client struct {
	hc      *http.Client
	tr      *http.Transport
	base    string
	timeout time.Duration
	// catchUp is when the check stops waiting for read models that are
	// behind the log (zero: no waiting beyond the server's own bound).
	catchUp time.Time
}

func newClient(base string, timeout time.Duration, conns int) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = conns
	return &client{hc: &http.Client{Transport: tr}, tr: tr, base: base, timeout: timeout}
}

func (c *client) close() { c.tr.CloseIdleConnections() }

// answer is an HTTP response read in full.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

// problem returns the last path segment of the problem type ("http-<code>"
// when the body is no problem document) and its detail.
func (a answer) problem() (reason, detail string) {
	var p struct{ Type, Title, Detail string }
	if json.Unmarshal(a.body, &p) != nil || p.Type == "" || p.Type == "about:blank" {
		return fmt.Sprintf("http-%d", a.code), truncate(string(a.body))
	}
	return p.Type[strings.LastIndex(p.Type, "/")+1:], cmp.Or(p.Detail, p.Title)
}

// do sends a request, retrying network errors and 5xx answers with
// backoff. It returns the last answer, or an error when none came.
func (c *client) do(ctx context.Context, method, path string, body []byte, key string) (answer, error) {
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		a, err := c.once(ctx, method, path, body, key)
		if err == nil && a.code < 500 || attempt == attempts || ctx.Err() != nil {
			return a, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return a, ctx.Err()
		case <-t.C:
		}
		backoff *= 2
	}
}

func (c *client) once(ctx context.Context, method, path string, body []byte, key string) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: b}, nil
}

// stepRequest is the body of POST /v1/orders/{id}/{command}.
type stepRequest struct {
	At     *time.Time `json:"at,omitempty"`
	Reason string     `json:"reason,omitempty"`
}

// outcome is the answer to one command: reason is "" when accepted, else
// "<command>: <reason>"; replayed is the Idempotent-Replayed header.
type outcome struct {
	reason, detail string
	replayed       bool
}

// sent is what sending one plan did.
type sent struct {
	answers []outcome
	skipped int
}

// send runs p's commands in order. After a rejection that is not in
// p.Refused it skips the rest.
func (c *client) send(ctx context.Context, p Plan) sent {
	var s sent
	for i, cmd := range p.Commands {
		path := "/v1/orders/" + url.PathEscape(p.Order.ID) + "/" + cmd.Name
		var body []byte
		if cmd.Place != nil {
			path, body = "/v1/orders", must(json.Marshal(cmd.Place))
		} else {
			r := stepRequest{Reason: cmd.Reason}
			if !cmd.At.IsZero() {
				r.At = &cmd.At
			}
			body = must(json.Marshal(r))
		}
		a, err := c.do(ctx, http.MethodPost, path, body, cmd.IdempotencyKey(p.Order.ID))
		var o outcome
		switch {
		case err != nil:
			o = outcome{reason: cmd.Name + ": unreachable", detail: err.Error()}
		case a.code/100 != 2:
			reason, detail := a.problem()
			o = outcome{reason: cmd.Name + ": " + reason, detail: detail}
		default:
			o.replayed = a.header.Get("Idempotent-Replayed") == "true"
		}
		s.answers = append(s.answers, o)
		if o.reason != "" && !slices.Contains(p.Refused, o.reason) {
			s.skipped = len(p.Commands) - i - 1
			break
		}
	}
	return s
}

// checked is the check of one order: the status read from the log fold
// ("" when unread), whether the read model equals the fold, whether the
// status is the expected one, and what is wrong ("" when nothing).
type checked struct {
	status          domain.Status
	equal, statusOK bool
	problem         string
}

// check reads the order's log fold and its read model at that version and
// compares them and the status with p.Want.
func (c *client) check(ctx context.Context, p Plan) checked {
	var ch checked
	var problems []string
	id := url.PathEscape(p.Order.ID)
	fold, o, _, err := c.getOrder(ctx, "/v1/orders/"+id)
	if err != nil {
		ch.problem = err.Error()
		return ch
	}
	ch.status = o.Status
	if ch.statusOK = o.Status == p.Want; !ch.statusOK {
		problems = append(problems, fmt.Sprintf("status %s, want %s", o.Status, p.Want))
	}
	path := fmt.Sprintf("/v1/order-summaries/%s?min_version=%d", id, o.Version)
	summary, s, stale, err := c.getOrder(ctx, path)
	for (err == nil && stale || errors.Is(err, errNotFound)) && time.Now().Before(c.catchUp) {
		// The projection is still catching up (behind, or not at the
		// order yet): wait longer, up to the check's overall bound.
		wait := max(min(time.Until(c.catchUp), c.timeout-2*time.Second), time.Second).Round(time.Second)
		summary, s, stale, err = c.getOrder(ctx, fmt.Sprintf("%s&wait=%s", path, wait))
	}
	switch {
	case err != nil:
		problems = append(problems, err.Error())
	case stale:
		problems = append(problems, fmt.Sprintf("read model stale at version %d, want %d", s.Version, o.Version))
	case !reflect.DeepEqual(fold, summary):
		problems = append(problems, "read model differs from the log fold: "+diff(fold, summary))
	default:
		ch.equal = true
	}
	ch.problem = strings.Join(problems, "; ")
	return ch
}

// errNotFound is a 404 answer: the document does not exist (yet).
var errNotFound = errors.New("not found")

// getOrder GETs an order document, as a JSON value and as a domain.Order,
// and whether the answer says X-Read-Model-Stale: true. Any answer but 200
// with a JSON object is an error.
func (c *client) getOrder(ctx context.Context, path string) (doc map[string]any, o domain.Order, stale bool, err error) {
	a, err := c.do(ctx, http.MethodGet, path, nil, "")
	switch {
	case err != nil:
	case a.code == http.StatusNotFound:
		reason, detail := a.problem()
		err = fmt.Errorf("%w: %d %s: %s", errNotFound, a.code, reason, detail)
	case a.code != http.StatusOK:
		reason, detail := a.problem()
		err = fmt.Errorf("%d %s: %s", a.code, reason, detail)
	default:
		if err = json.Unmarshal(a.body, &doc); err == nil {
			err = json.Unmarshal(a.body, &o)
		}
	}
	if err != nil {
		return nil, o, false, fmt.Errorf("GET %s: %w", path, err)
	}
	return doc, o, a.header.Get("X-Read-Model-Stale") == "true", nil
}

// diff names the top-level keys where a and b differ, with both values.
func diff(a, b map[string]any) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(merge(a, b))) {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, fmt.Sprintf("%s: log %s, read model %s", k, jsonText(a[k]), jsonText(b[k])))
		}
	}
	return strings.Join(out, "; ")
}

func merge(a, b map[string]any) map[string]any {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}

func jsonText(v any) string { return truncate(string(must(json.Marshal(v)))) }

func truncate(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
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
