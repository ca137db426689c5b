package http

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
)

// GetOrderSummary answers GET /v1/order-summaries/{id}[?min_version=N&wait=D]
// with the freshness headers (freshness.go); X-Read-Model-Version is
// Read-Model-Version's earlier name.
// With min_version it waits until the read model reflects version N or the
// wait (default SummaryWait, at most maxSummaryWait) ends; on timeout it
// answers with what it has and X-Read-Model-Stale: true, or 404 when the
// read model has nothing yet. Waiters of one summary share one poll of the
// store (summaryWatch); past MaxWaits waits it answers 503 with
// Retry-After.
func (s operations) GetOrderSummary(c echo.Context, id api.OrderId, p api.GetOrderSummaryParams) error {
	if err := validID("order id", id); err != nil {
		return err
	}
	var minVersion int64
	if v := text(p.MinVersion); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return invalid(domain.FieldError{Field: "min_version", Detail: "a version: a whole number >= 0"})
		}
		minVersion = n
	}
	wait := s.cfg.SummaryWait
	if v := text(p.Wait); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxSummaryWait {
			return invalid(domain.FieldError{Field: "wait", Detail: "a duration such as 2s, at most " + maxSummaryWait.String()})
		}
		wait = d
	}
	ctx := c.Request().Context()
	deadline := time.Now().Add(wait)
	o, err := s.cfg.ReadModels.Summary(ctx, id)
	r := read{order: o, err: err}
	settled := func(r read) bool {
		return (r.err == nil && r.order.Version >= minVersion) || (r.err != nil && !errors.Is(r.err, domain.ErrNotFound))
	}
	waited := !settled(r) && (r.err == nil || minVersion > 0)
	if waited {
		var ok bool
		if r, ok = s.watch.wait(ctx, id, deadline, r, settled); !ok {
			c.Response().Header().Set("Retry-After", "1")
			return echo.NewHTTPError(http.StatusServiceUnavailable, "too many read-your-writes waits in flight; retry")
		}
	}
	if r.err != nil {
		return r.err
	}
	h := c.Response().Header()
	h.Set("X-Read-Model-Version", strconv.FormatInt(r.order.Version, 10))
	h.Set(headerVersion, strconv.FormatInt(r.order.Version, 10))
	s.freshness(c, summariesName, r.order.RecordedAt)
	if r.order.Version < minVersion {
		h.Set("X-Read-Model-Stale", "true")
	} else if waited {
		s.metrics.seen.Observe(time.Since(r.order.RecordedAt).Seconds())
	}
	return c.JSON(http.StatusOK, r.order)
}

// ListOrderSummaries answers GET /v1/order-summaries?customer_id=&status=&limit=&cursor=
// with {"items": [...], "next_cursor": "..."}; next_cursor is absent on the
// last page. limit is 1..500, default 50. The cursor is opaque.
func (s operations) ListOrderSummaries(c echo.Context, p api.ListOrderSummariesParams) error {
	customer, status := text(p.CustomerId), text((*string)(p.Status))
	var fields []domain.FieldError
	if customer != "" && domain.ValidateID("customer id", customer) != nil {
		fields = append(fields, domain.FieldError{Field: "customer_id", Detail: "1 to 64 letters, digits, '_' or '-'"})
	}
	if status != "" && !domain.ValidStatus(status) {
		fields = append(fields, domain.FieldError{Field: "status", Detail: "one of created, approved, invoiced, processing, shipped, delivered, canceled, unavailable"})
	}
	limit := 50
	if v := text(p.Limit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			fields = append(fields, domain.FieldError{Field: "limit", Detail: "1 to 500"})
		}
		limit = n
	}
	after := ""
	if v := text(p.Cursor); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || domain.ValidateID("cursor", string(b)) != nil {
			fields = append(fields, domain.FieldError{Field: "cursor", Detail: "a next_cursor from an earlier page"})
		}
		after = string(b)
	}
	if len(fields) > 0 {
		return invalid(fields...)
	}
	items, err := s.cfg.ReadModels.ListSummaries(c.Request().Context(), customer, status, after, limit+1)
	if err != nil {
		return err
	}
	body := map[string]any{}
	if len(items) > limit {
		items = items[:limit]
		body["next_cursor"] = base64.RawURLEncoding.EncodeToString([]byte(items[limit-1].ID))
	}
	body["items"] = items
	var newest time.Time
	for _, o := range items {
		if o.RecordedAt.After(newest) {
			newest = o.RecordedAt
		}
	}
	s.freshness(c, summariesName, newest)
	return c.JSON(http.StatusOK, body)
}

func (s operations) GetCustomerOrderStats(c echo.Context, id api.CustomerId) error {
	if err := validID("customer id", id); err != nil {
		return err
	}
	st, err := s.cfg.ReadModels.CustomerStats(c.Request().Context(), id)
	if err != nil {
		return err
	}
	s.freshness(c, summariesName, st.RecordedAt)
	return c.JSON(http.StatusOK, st)
}
