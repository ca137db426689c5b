package http

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

func (c *ClientConfig) setDefaults() {
	c.URL = strings.TrimRight(c.URL, "/")
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
}

// Client is the client of the REST API that Server serves. Each call is
// one HTTP request, without retries: a call returns the domain type of a
// 2xx answer, an *Error for any other answer, an error wrapping
// ErrUndecodable for a 2xx body that does not decode, the transport's
// error (a *url.Error) when no answer came, or a read error when the
// answer was cut.
type Client struct {
	cfg ClientConfig
	api *api.Client // builds each operation's request from openapi.json
}

// NewClient returns a client of the service at cfg.URL, or an error when
// the URL is not http(s)://host[:port].
func NewClient(cfg ClientConfig) (*Client, error) {
	cfg.setDefaults()
	if u, err := url.Parse(cfg.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("URL %q: want http://host:port", cfg.URL)
	}
	a, err := api.NewClient(cfg.URL, api.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("URL %q: %w", cfg.URL, err)
	}
	return &Client{cfg: cfg, api: a}, nil
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

// call is one api.Client operation with its arguments bound: it sends the
// request, edited by edit, and returns the answer.
type call func(ctx context.Context, edit ...api.RequestEditorFn) (*http.Response, error)

// bind is the call of op with its one argument a.
func bind[A any](op func(context.Context, A, ...api.RequestEditorFn) (*http.Response, error), a A) call {
	return func(ctx context.Context, edit ...api.RequestEditorFn) (*http.Response, error) {
		return op(ctx, a, edit...)
	}
}

// bind2 is the call of op with its two arguments a and b.
func bind2[A, B any](op func(context.Context, A, B, ...api.RequestEditorFn) (*http.Response, error), a A, b B) call {
	return func(ctx context.Context, edit ...api.RequestEditorFn) (*http.Response, error) {
		return op(ctx, a, b, edit...)
	}
}

// do sends the request of op with the headers of h, decodes a 2xx answer
// into out (nil: not decoded) and returns its headers.
func (c *Client) do(ctx context.Context, op call, h http.Header, out any) (http.Header, error) {
	var method, path string
	resp, err := op(ctx, func(_ context.Context, req *http.Request) error {
		method, path = req.Method, strings.TrimPrefix(req.URL.String(), c.cfg.URL)
		for k, v := range h {
			req.Header[k] = v
		}
		req.Header.Set("Accept", "application/json, application/problem+json")
		if c.cfg.Token != "" {
			req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %d answer cut: %w", method, path, resp.StatusCode, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, newError(method, path, resp.StatusCode, resp.Header, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return resp.Header, fmt.Errorf("%s %s: %d answer %q: %w: %v", method, path, resp.StatusCode, excerpt(body), ErrUndecodable, err)
		}
	}
	return resp.Header, nil
}

// answer sends op and returns its 2xx answer decoded as a T; its errors
// are do's.
func answer[T any](ctx context.Context, c *Client, op call) (T, error) {
	var v T
	_, err := c.do(ctx, op, nil, &v)
	return v, err
}

// Execute sends cmd for the order: POST /v1/orders for a domain.PlaceOrder
// (orderID "" lets the server choose), else
// POST /v1/orders/{orderID}/{domain.CommandName(cmd)}. opt goes as the
// headers Idempotency-Key, If-Match: "<version>", X-Correlation-ID and
// X-Request-ID (CommandID). The Result has no Attempts. A refusal is an
// *Error wrapping the domain error: domain.ErrInvalidTransition,
// domain.ErrPreconditionFailed, domain.ErrValidation and so on.
func (c *Client) Execute(ctx context.Context, orderID string, cmd domain.Command, opt domain.ExecOptions) (domain.Result, error) {
	var op call
	switch x := cmd.(type) {
	case domain.PlaceOrder:
		body := api.PlaceRequest{CustomerId: x.CustomerID, Currency: x.Currency, FreightCents: omitZero(x.FreightCents), At: omitZero(x.At)}
		if orderID != "" {
			body.OrderId = &orderID
		}
		for _, l := range x.Items {
			body.Items = append(body.Items, api.ItemRequest{Sku: l.SKU, Quantity: l.Quantity, UnitPriceCents: l.UnitPriceCents,
				FreightCents: omitZero(l.FreightCents)})
		}
		op = bind(c.api.PlaceOrder, body)
	case domain.Approve:
		op = bind2(c.api.ApproveOrder, orderID, api.StepRequest{At: omitZero(x.At)})
	case domain.Invoice:
		op = bind2(c.api.InvoiceOrder, orderID, api.StepRequest{At: omitZero(x.At)})
	case domain.StartProcessing:
		op = bind2(c.api.ProcessOrder, orderID, api.StepRequest{At: omitZero(x.At)})
	case domain.Ship:
		op = bind2(c.api.ShipOrder, orderID, api.StepRequest{At: omitZero(x.At)})
	case domain.Deliver:
		op = bind2(c.api.DeliverOrder, orderID, api.StepRequest{At: omitZero(x.At)})
	case domain.Cancel:
		op = bind2(c.api.CancelOrder, orderID, api.ReasonRequest{At: omitZero(x.At), Reason: omitZero(x.Reason)})
	case domain.MarkUnavailable:
		op = bind2(c.api.MarkOrderUnavailable, orderID, api.ReasonRequest{At: omitZero(x.At), Reason: omitZero(x.Reason)})
	default:
		return domain.Result{}, fmt.Errorf("command %T: %w", cmd, domain.ErrValidation)
	}
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
	var res struct {
		OrderID string        `json:"order_id"`
		Version int64         `json:"version"`
		Status  domain.Status `json:"status"`
	}
	header, err := c.do(ctx, op, h, &res)
	if err != nil {
		return domain.Result{}, err
	}
	return domain.Result{OrderID: res.OrderID, Version: res.Version, Status: res.Status,
		Replayed: header.Get("Idempotent-Replayed") == "true"}, nil
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
	return answer[domain.Order](ctx, c, bind2(c.api.GetOrder, id, &api.GetOrderParams{}))
}

// DailySales returns the daily sales (summed from the order summaries) over the UTC dates
// of from to to, both included, of one currency unless currency is empty
// (GET /v1/daily-sales). An invalid range is an *Error wrapping
// domain.ErrValidation.
func (c *Client) DailySales(ctx context.Context, from, to time.Time, currency string) (DailySalesReport, error) {
	f, t := from.UTC().Format(time.DateOnly), to.UTC().Format(time.DateOnly)
	p := api.GetDailySalesParams{From: &f, To: &t}
	if currency != "" {
		p.Currency = &currency
	}
	return answer[DailySalesReport](ctx, c, bind(c.api.GetDailySales, &p))
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
		v := strconv.FormatInt(q.MinVersion, 10)
		p.MinVersion = &v
	}
	if q.Wait > 0 {
		w := q.Wait.String()
		p.Wait = &w
	}
	header, err := c.do(ctx, bind2(c.api.GetOrderSummary, id, &p), nil, &o)
	if err != nil {
		return domain.Order{}, false, err
	}
	return o, header.Get("X-Read-Model-Stale") == "true", nil
}
