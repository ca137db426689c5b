package http

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
)

// The log browser's routes (GET /v1/admin/log, /log/commits/{commit},
// /log/tail) and the history of the first screen (GET /v1/admin/history).

func (s operations) ListLog(c echo.Context, p api.ListLogParams) error {
	if err := onlyParams(c, "limit", "cursor", "type", "stream_id", "correlation_id"); err != nil {
		return err
	}
	q := domain.LogQuery{Limit: 50, Cursor: text(p.Cursor), StreamID: text(p.StreamId), Type: text((*string)(p.Type)), CorrelationID: text(p.CorrelationId)}
	var bad []domain.FieldError
	if v := text(p.Limit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			bad = append(bad, domain.FieldError{Field: "limit", Detail: "a whole number from 1 to 200"})
		}
		q.Limit = n
	}
	bad = append(bad, logFilters(q)...)
	if len(q.Cursor) > 512 {
		bad = append(bad, domain.FieldError{Field: "cursor", Detail: "not a cursor of this query"})
	}
	if len(bad) > 0 {
		return invalid(bad...)
	}
	page, err := s.cfg.Admin.Browse(c.Request().Context(), q)
	if errors.Is(err, domain.ErrValidation) {
		return invalid(domain.FieldError{Field: "cursor", Detail: "not a cursor of this query (its filters differ, or it is not one)"})
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

// logFilters checks the filters a page of the log and its tail share.
func logFilters(q domain.LogQuery) []domain.FieldError {
	var bad []domain.FieldError
	if types := domain.EventTypes(); q.Type != "" && !slices.Contains(types, q.Type) {
		bad = append(bad, domain.FieldError{Field: "type", Detail: "one of " + strings.Join(types, ", ")})
	}
	if q.StreamID != "" && domain.ValidateID("stream id", q.StreamID) != nil {
		bad = append(bad, domain.FieldError{Field: "stream_id", Detail: "1 to 128 letters, digits, '_' or '-'"})
	}
	if len(q.CorrelationID) > 128 {
		bad = append(bad, domain.FieldError{Field: "correlation_id", Detail: "at most 128 characters"})
	}
	return bad
}

// onlyParams refuses the query parameters of c not in known, each named
// in the 422: a misspelt filter would otherwise filter nothing, and the
// answer would look filtered.
func onlyParams(c echo.Context, known ...string) error {
	var bad []domain.FieldError
	for name := range c.QueryParams() {
		if !slices.Contains(known, name) {
			bad = append(bad, domain.FieldError{Field: name, Detail: "not a parameter of this route, which takes " + strings.Join(known, ", ")})
		}
	}
	if len(bad) == 0 {
		return nil
	}
	slices.SortFunc(bad, func(a, b domain.FieldError) int { return strings.Compare(a.Field, b.Field) })
	return invalid(bad...)
}

// commitID is the shape of a commit's id (mongodb.CommitID).
var commitID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}:[0-9]{10}$`)

func (s operations) GetLogCommit(c echo.Context, id string) error {
	if !commitID.MatchString(id) {
		return fmt.Errorf("commit %q: not a commit id: %w", id, domain.ErrNotFound)
	}
	commit, found, err := s.cfg.Admin.LogCommit(c.Request().Context(), id)
	if err == nil && !found {
		err = fmt.Errorf("commit %s: %w", id, domain.ErrNotFound)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, commit)
}

// sseKeepAlive is how long an idle event stream goes without a line: well
// under the idle timeouts of proxies (nginx's proxy_read_timeout is 60 s).
const sseKeepAlive = 15 * time.Second

// TailLog streams the commits recorded while the request is open that
// pass the filters of p as Server-Sent Events (see openapi.json, tailLog).
func (s operations) TailLog(c echo.Context, p api.TailLogParams) error {
	if err := onlyParams(c, "type", "stream_id", "correlation_id"); err != nil {
		return err
	}
	q := domain.LogQuery{StreamID: text(p.StreamId), Type: text((*string)(p.Type)), CorrelationID: text(p.CorrelationId)}
	if bad := logFilters(q); len(bad) > 0 {
		return invalid(bad...)
	}
	w := c.Response()
	// The server's write timeout bounds answers, not a stream that lasts
	// as long as the page that reads it. (A writer without deadlines, a
	// test's recorder, has none to lift.)
	if err := http.NewResponseController(w).SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	h := w.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: pass each event on at once
	opened, last := false, time.Now()
	send := func(event string, data any) error {
		b, err := encodeJSON(data)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		w.Flush()
		last = time.Now()
		return nil
	}
	// The stream ends with the request or when the server shuts down.
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	err := s.cfg.Admin.TailLog(ctx, func(commit *domain.LogCommit) error {
		switch {
		case !opened:
			opened = true
			w.WriteHeader(http.StatusOK)
			return send("open", struct{}{})
		case commit != nil && q.Matches(*commit):
			return send("commit", commit)
		case time.Since(last) >= sseKeepAlive:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return err
			}
			w.Flush()
			last = time.Now()
		}
		return nil
	})
	if err == nil || ctx.Err() != nil {
		return nil
	}
	if !opened {
		return err // answered as a problem document
	}
	// The status is sent: the failure goes in the stream, and it ends.
	prob := toProblem(err)
	if prob.Status >= 500 {
		s.cfg.Log.Warn("log tail ended", "err", err)
		prob.Detail = "the log's change stream failed, or this client fell behind it; connect again"
	}
	_ = send("error", prob)
	return nil
}

func (s operations) GetHistory(c echo.Context) error {
	h, err := s.cfg.Admin.History(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, h)
}
