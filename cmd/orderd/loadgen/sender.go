package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/pause"
)

// Retry backoff of one command: the first wait, doubled after each retry
// up to maxBackoff.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
)

// sender sends commands to the instances, with the run's retry policy.
type sender struct {
	tr       *http.Transport
	apis     []*orderhttp.Client // one per URL, over tr, each attempt bounded by RequestTimeout
	retryFor time.Duration       // per command, all attempts
}

// newSender returns a sender whose connections can only go to loopback
// addresses: no proxy, no redirects, and a dial-time check of the address.
// cfg.URLs must have been checked.
func newSender(cfg Config) (*sender, error) {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, Control: loopbackOnly}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = d.DialContext
	tr.MaxIdleConnsPerHost = cfg.Concurrency * 2
	tr.MaxIdleConns = cfg.Concurrency * 2 * len(cfg.URLs)
	hc := &http.Client{Transport: tr, Timeout: cfg.RequestTimeout, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // a command is never redirected; the 3xx is the answer
	}}
	s := &sender{tr: tr, retryFor: cfg.RetryFor}
	for _, u := range cfg.URLs {
		api, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: u, HTTPClient: hc})
		if err != nil {
			return nil, err
		}
		s.apis = append(s.apis, api)
	}
	return s, nil
}

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
	orderID string
	cmd     domain.Command
	key     string          // Idempotency-Key and X-Correlation-ID
	ifMatch *domain.IfMatch // nil for none
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
	attempts        int // HTTP attempts made, at least 1 unless ctx had ended
	paused          int // of which refused unrun while the read models were behind
	malformedAnswer bool
}

// send sends r to s.apis[first] until it gets an answer that is not
// retried: a transport error, a 5xx or a 429 is sent again, same key and
// body, to the next URL (round robin: a dead instance does not hold an
// order up while another can answer), with backoff, while RetryFor allows
// and ctx lasts.
func (s *sender) send(ctx context.Context, first int, r request) answer {
	opt := domain.ExecOptions{IdempotencyKey: r.key, CorrelationID: r.key, IfMatch: r.ifMatch}
	start := time.Now()
	backoff := firstBackoff
	var a answer
	for {
		if ctx.Err() != nil {
			a.outcome, a.detail = unknown, "stopped: "+ctx.Err().Error()+"; last: "+cmp.Or(a.detail, "not sent")
			return a
		}
		a.attempts++
		res, err := s.apis[(first+a.attempts-1)%len(s.apis)].Execute(ctx, r.orderID, r.cmd, opt)
		var pe *orderhttp.Error
		switch {
		case err == nil || errors.Is(err, orderhttp.ErrUndecodable):
			a.outcome = acked
			a.version, a.status = res.Version, string(res.Status)
			if err != nil {
				a.malformedAnswer, a.detail = true, err.Error()
			}
			return a
		case !errors.As(err, &pe):
			a.detail = err.Error()
		case pe.Paused():
			// Not run: the service asks for time to let its read models
			// catch up. Waiting as told is not giving up on the command.
			a.paused++
			start = start.Add(pe.RetryAfter) // the wait does not count against RetryFor
			pause.For(ctx, max(pe.RetryAfter, firstBackoff))
			continue
		case pe.Status == http.StatusTooManyRequests || pe.Status >= 500:
			a.detail = fmt.Sprintf("%d %s: %s", pe.Status, pe.Slug(), pe.Text())
		default:
			a.outcome, a.code = refused, pe.Status
			a.reason, a.detail = pe.Slug(), pe.Text()
			return a
		}
		if ctx.Err() == nil && time.Since(start)+backoff > s.retryFor {
			a.outcome = unknown
			a.detail = fmt.Sprintf("gave up after %d attempts in %v; last: %s", a.attempts, time.Since(start).Round(time.Millisecond), a.detail)
			return a
		}
		pause.For(ctx, backoff) // when ctx has ended, the loop's first check says so
		backoff = min(backoff*2, maxBackoff)
	}
}
