package http

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
	"strconv"
	"strings"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
)

// maxAnswerBytes bounds the part of an answer the Client reads and keeps;
// the rest is read and dropped, so the connection can be reused.
const maxAnswerBytes = 4 << 20

// excerptBytes is how much of an answer that is no problem document an
// Error keeps as its detail.
const excerptBytes = 200

// ErrUndecodable is wrapped by the error of a 2xx answer whose body is not
// the JSON the route promises.
var ErrUndecodable = errors.New("answer does not decode")

// ClientConfig configures a Client.
type ClientConfig struct {
	// URL is the base URL of the service, "http://host:port" (a trailing
	// slash is dropped): http or https, with a host.
	URL string
	// Token is the bearer token of the admin routes (the server's
	// AdminToken); "" sends no Authorization header.
	Token string
	// HTTPClient sends the requests: its transport, redirect policy and
	// timeout are the caller's [http.DefaultClient].
	HTTPClient *http.Client
}

// Client is the client of the REST API that Server serves. Each call is
// one HTTP request, without retries: a call returns the domain type of a
// 2xx answer, an *Error for any other answer, an error wrapping
// ErrUndecodable for a 2xx body that does not decode, the transport's
// error (a *url.Error) when no answer came, or a read error when the
// answer was cut.
type Client struct {
	cfg ClientConfig
	api *api.Client // builds each operation's request from openapi.json, sent by sender
}

// NewClient returns a client of the service at cfg.URL, or an error when
// the URL is not http(s)://host[:port].
func NewClient(cfg ClientConfig) (*Client, error) {
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	if u, err := url.Parse(cfg.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("URL %q: want http://host:port", cfg.URL)
	}
	c := &Client{cfg: cfg}
	var err error
	if c.api, err = api.NewClient(cfg.URL, api.WithHTTPClient(sender{&c.cfg})); err != nil {
		return nil, fmt.Errorf("URL %q: %w", cfg.URL, err)
	}
	return c, nil
}

// BaseURL is the service's URL, ClientConfig.URL without a trailing slash.
func (c *Client) BaseURL() string { return c.cfg.URL }

// Error is an answer other than 2xx: the problem document the server sent
// (RFC 9457), or, when the body was none, Status with the start of the
// body as Detail and an empty Type. It wraps the domain error that the
// server's table (codes) maps to its problem type, if any, so that
// errors.Is(err, domain.ErrNotFound) holds for a /problems/not-found.
type Error struct {
	Problem
	Method, Path string // of the request; Path with its query
	// RetryAfter is the answer's Retry-After in seconds, as a duration;
	// 0 when it had none (or gave a date).
	RetryAfter time.Duration
	err        error // the domain error, or nil
}

// Paused reports whether the service refused the request for a while,
// saying when to come back (RetryAfter): a command not run because its
// read models are behind (503 read-models-behind), or a read of a read
// model whose first build is under way (503 read-model-building). Sending
// it again after RetryAfter is always safe.
func (e *Error) Paused() bool {
	return e.Status == http.StatusServiceUnavailable && (e.Slug() == "read-models-behind" || e.Slug() == "read-model-building")
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Slug(), e.Text())
}

func (e *Error) Unwrap() error { return e.err }

// Slug is the last path segment of the problem type ("not-found",
// "invalid-transition"), or "http-<status>" when the answer had no problem
// type.
func (e *Error) Slug() string {
	if e.Type == "" || e.Type == "about:blank" {
		return "http-" + strconv.Itoa(e.Status)
	}
	return e.Type[strings.LastIndex(e.Type, "/")+1:]
}

// Text is the problem's detail, or its title when it has none.
func (e *Error) Text() string { return cmp.Or(e.Detail, e.Title) }

// newError reads an answer of status to a request as an *Error.
func newError(method, path string, status int, h http.Header, body []byte) *Error {
	e := &Error{Method: method, Path: path}
	if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	if json.Unmarshal(body, &e.Problem) != nil || e.Type == "" {
		e.Problem = Problem{Detail: excerpt(body)}
	}
	e.Status = status
	slug := e.Slug()
	for _, c := range codes {
		if c.slug == slug {
			e.err = c.err
			break
		}
	}
	return e
}

// excerpt returns body without surrounding space, cut to excerptBytes
// ("..." appended when cut).
func excerpt(body []byte) string {
	s := strings.TrimSpace(string(body))
	if len(s) > excerptBytes {
		return s[:excerptBytes] + "..."
	}
	return s
}

// sender sends the requests of the Client's api.Client, each once, with
// the Accept and Authorization headers, and reads the answer whole: a
// 2xx comes back with its body read (the rest past maxAnswerBytes
// dropped, so the connection can be reused), any other answer as an
// *Error.
type sender struct{ cfg *ClientConfig }

func (s sender) Do(req *http.Request) (*http.Response, error) {
	req.Header.Set("Accept", "application/json, application/problem+json")
	if s.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Token)
	}
	resp, err := s.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %d answer cut: %w", req.Method, req.URL.RequestURI(), resp.StatusCode, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, newError(req.Method, req.URL.RequestURI(), resp.StatusCode, resp.Header, body)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.Request = req
	return resp, nil
}

// answer decodes the answer of an api.Client call, sent by sender, as a
// T. Its errors are the call's, or one wrapping ErrUndecodable.
func answer[T any](resp *http.Response, err error) (T, error) {
	var v T
	if err != nil {
		return v, err
	}
	body, _ := io.ReadAll(resp.Body) // a bytes.Reader
	if err := json.Unmarshal(body, &v); err != nil {
		return v, fmt.Errorf("%s %s: %d answer %q: %w: %v", resp.Request.Method, resp.Request.URL.RequestURI(), resp.StatusCode,
			excerpt(body), ErrUndecodable, err)
	}
	return v, nil
}

// Execute sends cmd for the order: POST /v1/orders for a domain.PlaceOrder
// (orderID "" lets the server choose), else
// POST /v1/orders/{orderID}/{domain.CommandName(cmd)}. opt goes as the
// headers Idempotency-Key, If-Match: "<version>", X-Correlation-ID and
// X-Request-ID (CommandID). The Result has no Attempts. A refusal is an
// *Error wrapping the domain error: domain.ErrInvalidTransition,
// domain.ErrPreconditionFailed, domain.ErrValidation and so on.
func (c *Client) Execute(ctx context.Context, orderID string, cmd domain.Command, opt domain.ExecOptions) (domain.Result, error) {
	h := http.Header{}
	setHeader(h, "Idempotency-Key", opt.IdempotencyKey)
	setHeader(h, "X-Correlation-ID", opt.CorrelationID)
	setHeader(h, "X-Request-ID", opt.CommandID)
	if m := opt.IfMatch; m != nil {
		tags := make([]string, len(m.Versions))
		for i, v := range m.Versions {
			tags[i] = etag(v)
		}
		if m.Any {
			tags = []string{"*"}
		}
		h.Set("If-Match", strings.Join(tags, ", "))
	}
	headers := func(_ context.Context, req *http.Request) error {
		maps.Copy(req.Header, h)
		return nil
	}
	var resp *http.Response
	var err error
	switch x := cmd.(type) {
	case domain.PlaceOrder:
		body := api.PlaceRequest{OrderId: omitZero(orderID), CustomerId: x.CustomerID, Currency: x.Currency,
			FreightCents: omitZero(x.FreightCents), At: omitZero(x.At)}
		for _, l := range x.Items {
			body.Items = append(body.Items, api.ItemRequest{Sku: l.SKU, Quantity: l.Quantity, UnitPriceCents: l.UnitPriceCents,
				FreightCents: omitZero(l.FreightCents)})
		}
		resp, err = c.api.PlaceOrder(ctx, body, headers)
	case domain.Approve:
		resp, err = c.api.ApproveOrder(ctx, orderID, api.StepRequest{At: omitZero(x.At)}, headers)
	case domain.Invoice:
		resp, err = c.api.InvoiceOrder(ctx, orderID, api.StepRequest{At: omitZero(x.At)}, headers)
	case domain.StartProcessing:
		resp, err = c.api.ProcessOrder(ctx, orderID, api.StepRequest{At: omitZero(x.At)}, headers)
	case domain.Ship:
		resp, err = c.api.ShipOrder(ctx, orderID, api.StepRequest{At: omitZero(x.At)}, headers)
	case domain.Deliver:
		resp, err = c.api.DeliverOrder(ctx, orderID, api.StepRequest{At: omitZero(x.At)}, headers)
	case domain.Cancel:
		resp, err = c.api.CancelOrder(ctx, orderID, api.ReasonRequest{At: omitZero(x.At), Reason: omitZero(x.Reason)}, headers)
	case domain.MarkUnavailable:
		resp, err = c.api.MarkOrderUnavailable(ctx, orderID, api.ReasonRequest{At: omitZero(x.At), Reason: omitZero(x.Reason)}, headers)
	default:
		return domain.Result{}, fmt.Errorf("command %T: %w", cmd, domain.ErrValidation)
	}
	res, err := answer[api.CommandResult](resp, err)
	if err != nil {
		return domain.Result{}, err
	}
	return domain.Result{OrderID: res.OrderId, Version: res.Version, Status: domain.Status(res.Status),
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

func setHeader(h http.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

// omitZero is &v, or nil for v's zero value: left out of the body, where
// the server takes it as zero (a time.Time is compared with ==, so the
// zero instant in a location other than UTC is sent; the server reads it
// as the zero time too, and uses its receive time).
func omitZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// Order returns the order folded from its event log (GET /v1/orders/{id}),
// or an *Error wrapping domain.ErrNotFound.
func (c *Client) Order(ctx context.Context, id string) (domain.Order, error) {
	return answer[domain.Order](c.api.GetOrder(ctx, id, &api.GetOrderParams{}))
}

// DailySales returns the daily sales (summed from the order summaries) over the UTC dates
// of from to to, both included, of one currency unless currency is empty
// (GET /v1/daily-sales). An invalid range is an *Error wrapping
// domain.ErrValidation.
func (c *Client) DailySales(ctx context.Context, from, to time.Time, currency string) (DailySalesReport, error) {
	p := api.GetDailySalesParams{From: new(from.UTC().Format(time.DateOnly)), To: new(to.UTC().Format(time.DateOnly)),
		Currency: omitZero(currency)}
	return answer[DailySalesReport](c.api.GetDailySales(ctx, &p))
}

// SummaryQuery asks GET /v1/order-summaries/{id} to wait until the read
// model reflects MinVersion (0: no wait), for at most Wait (0: the
// server's default bound).
type SummaryQuery struct {
	MinVersion int64
	Wait       time.Duration
}

// Summary returns the order's read model (order_summaries) and whether it
// is stale: older than q.MinVersion when the wait ended
// (X-Read-Model-Stale). It returns an *Error wrapping domain.ErrNotFound
// while the read model has nothing of the order.
func (c *Client) Summary(ctx context.Context, id string, q SummaryQuery) (o domain.Order, stale bool, err error) {
	var p api.GetOrderSummaryParams
	if q.MinVersion > 0 {
		p.MinVersion = new(strconv.FormatInt(q.MinVersion, 10))
	}
	if q.Wait > 0 {
		p.Wait = new(q.Wait.String())
	}
	resp, err := c.api.GetOrderSummary(ctx, id, &p)
	if o, err = answer[domain.Order](resp, err); err != nil {
		return domain.Order{}, false, err
	}
	return o, resp.Header.Get("X-Read-Model-Stale") == "true", nil
}
