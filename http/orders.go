package http

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
)

// placeRequest is the body of POST /v1/orders. Amounts are minor units.
// freight_cents is an optional whole-order charge on top of the lines'
// own freight_cents.
type placeRequest struct {
	OrderID      string        `json:"order_id" validate:"omitempty,id"`
	CustomerID   string        `json:"customer_id" validate:"required,id"`
	Currency     string        `json:"currency" validate:"required,len=3,uppercase,alpha"`
	Items        []itemRequest `json:"items" validate:"required,min=1,max=500,dive"`
	FreightCents int64         `json:"freight_cents" validate:"min=0,max=1000000000000"`
	At           string        `json:"at" validate:"omitempty,rfc3339"`
}

// itemRequest is one line: unit_price_cents per unit, the optional
// freight_cents for the whole line (Olist's freight_value per item).
type itemRequest struct {
	SKU            string `json:"sku" validate:"required,id"`
	Quantity       int64  `json:"quantity" validate:"required,min=1,max=1000000"`
	UnitPriceCents *int64 `json:"unit_price_cents" validate:"required,min=0,max=1000000000000"`
	FreightCents   int64  `json:"freight_cents" validate:"min=0,max=1000000000000"`
}

// stepRequest is the optional body of approve, invoice, process, ship and
// deliver; reasonRequest of cancel and mark-unavailable.
type stepRequest struct {
	At string `json:"at" validate:"omitempty,rfc3339"`
}

type reasonRequest struct {
	At     string `json:"at" validate:"omitempty,rfc3339"`
	Reason string `json:"reason" validate:"max=500"`
}

// parseTime parses a validated RFC 3339 time; "" is the zero time (the
// service then uses its receive time).
func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

func (s operations) PlaceOrder(c echo.Context) error {
	var req placeRequest
	if err := decode(c, &req, false); err != nil {
		return err
	}
	cmd := domain.PlaceOrder{CustomerID: req.CustomerID, Currency: req.Currency, FreightCents: req.FreightCents, At: parseTime(req.At)}
	for _, it := range req.Items {
		cmd.Items = append(cmd.Items, domain.Line{SKU: it.SKU, Quantity: it.Quantity, UnitPriceCents: *it.UnitPriceCents,
			FreightCents: it.FreightCents})
	}
	res, err := s.execute(c, req.OrderID, cmd)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/orders/"+res.OrderID)
	return respond(c, http.StatusCreated, res)
}

func (s operations) ApproveOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r stepRequest) domain.Command { return domain.Approve{At: parseTime(r.At)} })
}

func (s operations) InvoiceOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r stepRequest) domain.Command { return domain.Invoice{At: parseTime(r.At)} })
}

func (s operations) ProcessOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r stepRequest) domain.Command { return domain.StartProcessing{At: parseTime(r.At)} })
}

func (s operations) ShipOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r stepRequest) domain.Command { return domain.Ship{At: parseTime(r.At)} })
}

func (s operations) DeliverOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r stepRequest) domain.Command { return domain.Deliver{At: parseTime(r.At)} })
}

func (s operations) CancelOrder(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r reasonRequest) domain.Command { return domain.Cancel{At: parseTime(r.At), Reason: r.Reason} })
}

func (s operations) MarkOrderUnavailable(c echo.Context, id api.OrderId) error {
	return step(s, c, id, func(r reasonRequest) domain.Command {
		return domain.MarkUnavailable{At: parseTime(r.At), Reason: r.Reason}
	})
}

// step answers POST /v1/orders/{id}/<command> for a lifecycle command,
// which cmd makes of the optional body: a stepRequest, or a reasonRequest
// for cancel and mark-unavailable. It runs the command and answers 200.
func step[R any](s operations, c echo.Context, id string, cmd func(R) domain.Command) error {
	var req R
	if err := decode(c, &req, true); err != nil {
		return err
	}
	res, err := s.execute(c, id, cmd(req))
	if err != nil {
		return err
	}
	return respond(c, http.StatusOK, res)
}

// execute reads the command headers and runs cmd, unless the admission
// refuses it.
func (s *Server) execute(c echo.Context, orderID string, cmd domain.Command) (domain.Result, error) {
	opt, err := commandOptions(c)
	if err != nil {
		return domain.Result{}, err
	}
	start := time.Now()
	if err := s.admit(c); err != nil {
		// Counted as its outcome, without a duration: nothing ran.
		s.metrics.commands.WithLabelValues(domain.CommandName(cmd), "read-models-behind").Inc()
		return domain.Result{}, err
	}
	res, err := s.cfg.Commands.Execute(c.Request().Context(), orderID, cmd, opt)
	s.metrics.command(domain.CommandName(cmd), res, err, time.Since(start))
	return res, err
}

func respond(c echo.Context, status int, res domain.Result) error {
	h := c.Response().Header()
	h.Set("ETag", etag(res.Version))
	if res.Replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	return c.JSON(status, map[string]any{"order_id": res.OrderID, "version": res.Version, "status": res.Status})
}

func etag(v int64) string { return `"` + strconv.FormatInt(v, 10) + `"` }

// commandOptions reads Idempotency-Key, If-Match and X-Correlation-ID. A
// malformed header is a validation error (422). An If-Match none of
// whose entity tags can match a version (weak tags, tags of no version)
// wraps domain.ErrPreconditionFailed (412) without running the command.
func commandOptions(c echo.Context) (domain.ExecOptions, error) {
	h := c.Request().Header
	opt := domain.ExecOptions{CommandID: c.Response().Header().Get(echo.HeaderXRequestID)}
	if k := h.Get("Idempotency-Key"); k != "" {
		if !token(k, 128) {
			return opt, invalid(domain.FieldError{Field: "Idempotency-Key", Detail: "1 to 128 visible ASCII characters"})
		}
		opt.IdempotencyKey = k
	}
	var unmatchable error
	if lines := h.Values("If-Match"); len(lines) > 0 {
		m, err := parseIfMatch(strings.Join(lines, ","))
		if err != nil {
			return opt, invalid(domain.FieldError{Field: "If-Match", Detail: err.Error() +
				`; If-Match takes the ETag as sent, "<version>", a comma-separated list of them, or * (RFC 9110 §13.1.1)`})
		}
		if !m.Any && len(m.Versions) == 0 {
			unmatchable = fmt.Errorf("If-Match %s: no entity tag in it can match: the ETags are strong, \"<version>\", and If-Match compares strong tags only, so a weak tag W/\"...\" never matches (RFC 9110 §13.1.1): %w",
				clip(strings.Join(lines, ", ")), domain.ErrPreconditionFailed)
		}
		opt.IfMatch = &m
	}
	if id := h.Get("X-Correlation-ID"); id != "" {
		if !token(id, 128) {
			return opt, invalid(domain.FieldError{Field: "X-Correlation-ID", Detail: "1 to 128 visible ASCII characters"})
		}
		opt.CorrelationID = id
	}
	// Checked last: a precondition is evaluated only on an otherwise
	// valid request (RFC 9110 §13.2.1).
	return opt, unmatchable
}

// parseIfMatch parses an If-Match field value (RFC 9110 §13.1.1): "*",
// or a list of entity tags (§8.8.3), each [W/]"<opaque>", separated by
// commas and optional white space. The strong tags that are a version's
// ETag ("<version>", version ≥ 1, as etag writes it) are the versions;
// a weak tag never matches under the strong comparison If-Match uses
// (§8.8.3.2), nor does a tag no version has, so neither adds one. Errors
// say what is malformed.
func parseIfMatch(v string) (domain.IfMatch, error) {
	v = strings.Trim(v, " \t")
	if v == "*" {
		return domain.IfMatch{Any: true}, nil
	}
	m := domain.IfMatch{Versions: []int64{}}
	tags := 0
	for i := 0; i < len(v); {
		switch v[i] {
		case ' ', '\t', ',': // white space and empty list elements (§5.6.1)
			i++
			continue
		}
		rest := v[i:]
		weak := strings.HasPrefix(rest, "W/")
		if weak {
			rest = rest[2:]
		}
		if rest == "" || rest[0] != '"' {
			if strings.HasPrefix(rest, "*") {
				return m, errors.New("* stands alone, not in a list")
			}
			word, _, _ := strings.Cut(rest, ",")
			word = clip(strings.TrimSpace(word))
			return m, fmt.Errorf("%s is not an entity tag: an entity tag is quoted, as in \"%s\"", word, strings.Trim(word, `"`))
		}
		end := strings.IndexByte(rest[1:], '"')
		if end < 0 {
			return m, fmt.Errorf("%s: an entity tag lacks its closing quote", clip(rest))
		}
		opaque := rest[1 : 1+end]
		for j := 0; j < len(opaque); j++ {
			if c := opaque[j]; c < 0x21 || c == 0x7f {
				return m, fmt.Errorf("entity tag %q: control characters and spaces are not allowed in it", clip(opaque))
			}
		}
		tags++
		if n, err := strconv.ParseInt(opaque, 10, 64); !weak && err == nil && n >= 1 && etag(n) == `"`+opaque+`"` {
			m.Versions = append(m.Versions, n)
		}
		i = len(v) - len(rest) + end + 2
		for i < len(v) && (v[i] == ' ' || v[i] == '\t') {
			i++
		}
		if i < len(v) && v[i] != ',' {
			return m, fmt.Errorf("%s: entity tags are separated by commas", clip(v[i:]))
		}
	}
	if tags == 0 {
		return m, errors.New("no entity tag in it")
	}
	return m, nil
}

// clip shortens s, a part of a header quoted in a problem's detail.
func clip(s string) string {
	if len(s) <= 32 {
		return s
	}
	return s[:32] + "…"
}

func token(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// GetOrder answers GET /v1/orders/{id}[?as_of_version=N|?as_of=T]: the
// order folded from the log, up to the bound when one is given (see
// historyBound). ETag is the folded version.
func (s operations) GetOrder(c echo.Context, id api.OrderId, p api.GetOrderParams) error {
	b, err := historyBound(p.AsOfVersion, p.AsOf)
	if err != nil {
		return err
	}
	var o domain.Order
	if b == (domain.Bound{}) {
		o, err = s.cfg.Commands.Get(c.Request().Context(), id)
	} else {
		o, _, err = s.cfg.Commands.EventsUntil(c.Request().Context(), id, b)
	}
	if err != nil {
		return notFoundIfInvalid(err)
	}
	c.Response().Header().Set("ETag", etag(o.Version))
	return c.JSON(http.StatusOK, o)
}

// GetOrderEvents answers GET /v1/orders/{id}/events[?as_of_version=N|?as_of=T]
// with the stream up to the bound, in version order.
func (s operations) GetOrderEvents(c echo.Context, id api.OrderId, p api.GetOrderEventsParams) error {
	b, err := historyBound(p.AsOfVersion, p.AsOf)
	if err != nil {
		return err
	}
	o, events, err := s.cfg.Commands.EventsUntil(c.Request().Context(), id, b)
	if err != nil {
		return notFoundIfInvalid(err)
	}
	out := make([]json.RawMessage, len(events))
	for i, e := range events {
		if out[i], err = domain.MarshalEvent(e); err != nil {
			return err
		}
	}
	c.Response().Header().Set("ETag", etag(o.Version))
	return c.JSON(http.StatusOK, map[string]any{"order_id": o.ID, "version": o.Version, "events": out})
}

// historyBound reads ?as_of_version (a version >= 1) or ?as_of (an RFC
// 3339 time, compared with the events' recorded_at), at most one of them,
// nil when not given; the zero Bound when neither is given. A parameter
// given empty, malformed or together with the other is a validation error
// (422).
func historyBound(asOfVersion, asOf *string) (domain.Bound, error) {
	byVersion, byTime := asOfVersion != nil, asOf != nil
	var b domain.Bound
	switch {
	case byVersion && byTime:
		return b, invalid(domain.FieldError{Field: "as_of", Detail: "give as_of or as_of_version, not both"})
	case byVersion:
		n, err := strconv.ParseInt(*asOfVersion, 10, 64)
		if err != nil || n < 1 {
			return b, invalid(domain.FieldError{Field: "as_of_version", Detail: "a version: a whole number >= 1"})
		}
		b.Version = n
	case byTime:
		t, err := time.Parse(time.RFC3339Nano, *asOf)
		if err != nil || !domain.ValidTime(t) {
			return b, invalid(domain.FieldError{Field: "as_of", Detail: "an RFC 3339 time such as 2026-11-25T08:00:00Z"})
		}
		b.At = t
	}
	return b, nil
}

// validID checks a path's id as an id of what; one that cannot exist is
// answered 404 (see notFoundIfInvalid).
func validID(what, id string) error {
	return notFoundIfInvalid(domain.ValidateID(what, id))
}

// notFoundIfInvalid answers a GET with an id that cannot exist as 404: the
// id was checked before any query and there is nothing to find.
func notFoundIfInvalid(err error) error {
	if errors.Is(err, domain.ErrValidation) {
		return fmt.Errorf("%v: %w", err, domain.ErrNotFound)
	}
	return err
}
