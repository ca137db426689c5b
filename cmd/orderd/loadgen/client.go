package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Retry backoff of one command: the first wait, doubled after each retry
// up to maxBackoff.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
	maxBodyBytes = 1 << 20 // of an answer kept for parsing; the rest is read and dropped
)

// client sends commands. Only this file knows the REST contract.
type client struct {
	hc       *http.Client
	tr       *http.Transport
	urls     []string      // base URLs, checked
	timeout  time.Duration // per attempt
	retryFor time.Duration // per command, all attempts
}

// newClient returns a client whose connections can only go to loopback
// addresses: no proxy, no redirects, and a dial-time check of the address.
func newClient(cfg Config) *client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, Control: loopbackOnly}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = d.DialContext
	tr.MaxIdleConnsPerHost = cfg.Concurrency * 2
	tr.MaxIdleConns = cfg.Concurrency * 2 * len(cfg.URLs)
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a command is never redirected; the 3xx is the answer
	}}
	return &client{hc: hc, tr: tr, urls: cfg.URLs, timeout: cfg.RequestTimeout, retryFor: cfg.RetryFor}
}

func (c *client) close() { c.tr.CloseIdleConnections() }

// loopbackOnly is the dialer's Control: it refuses any address that is not
// a loopback IP, whatever a host name resolved to.
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("loadgen connects only to loopback addresses, not %s", address)
	}
	return nil
}

// checkURL returns u without a trailing slash when it is an http(s) URL of
// a loopback host (127.0.0.0/8, ::1 or localhost), else an error.
func checkURL(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", fmt.Errorf("URL %q: %v", u, err)
	}
	if (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.User != nil || p.RawQuery != "" || p.Fragment != "" {
		return "", fmt.Errorf("URL %q: want http://host:port", u)
	}
	host := p.Hostname()
	if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("URL %q: only loopback hosts (127.0.0.0/8, ::1, localhost) are allowed", u)
	}
	return strings.TrimRight(u, "/"), nil
}

// request is one command as sent, identical on every attempt.
type request struct {
	path    string // "/v1/orders" or "/v1/orders/<id>/<command>"
	body    []byte
	key     string // Idempotency-Key and X-Correlation-ID
	ifMatch int64  // the If-Match version; -1 for none
}

// outcome is how a command ended.
type outcome int

const (
	acked   outcome = iota // a 2xx
	refused                // any other answer that is not retried (4xx, 3xx)
	unknown                // no answer that tells, after RetryFor or when ctx ended
)

// answer is what one command got. For acked, version and status are from
// the body; for refused, code, reason (the problem type's last path
// segment, or "http-<code>") and detail; for unknown, detail says why.
type answer struct {
	outcome         outcome
	code            int
	reason, detail  string
	version         int64
	status          string
	replayed        bool
	attempts        int // HTTP attempts made, at least 1 unless ctx had ended
	malformedAnswer bool
}

// send sends r to c.urls[first] until it gets an answer that is not
// retried: a transport error, a 5xx or a 429 is sent again, same key and
// body, to the next URL (round robin: a dead instance does not hold an
// order up while another can answer), with backoff, while RetryFor allows
// and ctx lasts.
func (c *client) send(ctx context.Context, first int, r request) answer {
	start := time.Now()
	backoff := firstBackoff
	var a answer
	for {
		if ctx.Err() != nil {
			a.outcome, a.detail = unknown, "stopped: "+ctx.Err().Error()+"; last: "+cmp.Or(a.detail, "not sent")
			return a
		}
		a.attempts++
		code, header, body, err := c.once(ctx, c.urls[(first+a.attempts-1)%len(c.urls)], r)
		switch {
		case err != nil:
			a.detail = err.Error()
		case code == http.StatusTooManyRequests || code >= 500:
			reason, detail := problem(code, body)
			a.detail = fmt.Sprintf("%d %s: %s", code, reason, detail)
		case code/100 == 2:
			a.outcome, a.code = acked, code
			a.replayed = header.Get("Idempotent-Replayed") == "true"
			var res struct {
				Version int64  `json:"version"`
				Status  string `json:"status"`
			}
			if json.Unmarshal(body, &res) != nil {
				a.malformedAnswer, a.detail = true, truncate(string(body))
			}
			a.version, a.status = res.Version, res.Status
			return a
		default:
			a.outcome, a.code = refused, code
			a.reason, a.detail = problem(code, body)
			return a
		}
		if ctx.Err() != nil || time.Since(start)+backoff > c.retryFor {
			a.outcome = unknown
			if ctx.Err() != nil {
				a.detail = "stopped: " + ctx.Err().Error() + "; last: " + a.detail
			} else {
				a.detail = fmt.Sprintf("gave up after %d attempts in %v; last: %s", a.attempts, time.Since(start).Round(time.Millisecond), a.detail)
			}
			return a
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// once makes one HTTP attempt and reads the whole answer.
func (c *client) once(ctx context.Context, base string, r request) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.path, bytes.NewReader(r.body))
	if err != nil {
		return 0, nil, nil, err
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, application/problem+json")
	h.Set("Idempotency-Key", r.key)
	h.Set("X-Correlation-ID", r.key)
	if r.ifMatch >= 0 {
		h.Set("If-Match", `"`+strconv.FormatInt(r.ifMatch, 10)+`"`)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // all of it, so the connection is reused
	}
	if err != nil {
		// The answer was cut: it tells nothing, so it is retried like a
		// transport error.
		return 0, nil, nil, fmt.Errorf("%d answer cut: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, resp.Header, body, nil
}

// problem returns the last path segment of the problem type of an error
// answer ("http-<code>" when the body is no problem document) and its
// detail.
func problem(code int, body []byte) (reason, detail string) {
	var p struct{ Type, Title, Detail string }
	if json.Unmarshal(body, &p) != nil || p.Type == "" || p.Type == "about:blank" {
		return fmt.Sprintf("http-%d", code), truncate(strings.TrimSpace(string(body)))
	}
	return p.Type[strings.LastIndex(p.Type, "/")+1:], truncate(cmp.Or(p.Detail, p.Title))
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
