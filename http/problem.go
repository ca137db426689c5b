package http

import (
	"cmp"
	"errors"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
)

// Problem is an RFC 9457 problem document. Type is a stable relative URI,
// "/problems/<slug>"; Errors lists per-field details of a validation
// failure.
type Problem struct {
	Type   string              `json:"type"`
	Title  string              `json:"title"`
	Status int                 `json:"status"`
	Detail string              `json:"detail,omitempty"`
	Errors []domain.FieldError `json:"errors,omitempty"`
}

// problemError is an error the handlers raise themselves, already mapped.
type problemError struct {
	status int
	slug   string
	detail string
	fields []domain.FieldError
}

func (e *problemError) Error() string { return e.detail }

func malformed(detail string) error {
	return &problemError{status: http.StatusBadRequest, slug: "malformed", detail: detail}
}

func invalid(fields ...domain.FieldError) error {
	return &problemError{status: http.StatusUnprocessableEntity, slug: "validation", detail: "the request has invalid fields", fields: fields}
}

// codes maps the domain's errors to statuses and problem types: the one
// table of the HTTP error vocabulary.
var codes = []struct {
	err    error
	status int
	slug   string
	title  string
}{
	{domain.ErrValidation, http.StatusUnprocessableEntity, "validation", "Validation failed"},
	{domain.ErrNotFound, http.StatusNotFound, "not-found", "Not found"},
	{domain.ErrInvalidTransition, http.StatusConflict, "invalid-transition", "Command not allowed in the order's status"},
	{domain.ErrAlreadyExists, http.StatusConflict, "already-exists", "Order exists with other content"},
	{domain.ErrVersionConflict, http.StatusConflict, "conflict", "Concurrent update; retry"},
	{domain.ErrPreconditionFailed, http.StatusPreconditionFailed, "precondition-failed", "If-Match does not match the order"},
	{domain.ErrIdempotencyKeyReused, http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency-Key was used for another request"},
	{domain.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "A dependency is unavailable"},
	{domain.ErrJobRunning, http.StatusConflict, "job-running", "A rebuild of this projection is already running"},
	{domain.ErrJobFinished, http.StatusConflict, "job-finished", "The job has already finished"},
	{domain.ErrRetryFailed, http.StatusConflict, "retry-failed", "The dead letter still cannot be applied"},
	{domain.ErrNotBuilt, http.StatusServiceUnavailable, "read-model-building", "The read model is being built from the log"},
	{domain.ErrOtherVersion, http.StatusConflict, "projection-version", "The store holds another version of this projection"},
	{domain.ErrNoPrevious, http.StatusConflict, "no-previous", "No previous version to switch back to"},
}

var titles = map[string]string{
	"malformed":          "Malformed request",
	"validation":         "Validation failed",
	"unsupported":        "Unsupported media type",
	"too-large":          "Request body too large",
	"route":              "No such route",
	"method":             "Method not allowed",
	"unauthorized":       "Unauthorized",
	"overloaded":         "Too many requests in flight",
	"read-models-behind": "The read models are behind; commands paused",
	"internal":           "Internal error",
}

// errorHandler writes every error as a problem document. It logs only
// 5xx, but for the service's own refusals (a pause of the commands).
func errorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := toProblem(err)
		var own *problemError // written here, for clients: no internals, and counted, not logged
		switch {
		case errors.Is(err, domain.ErrNotBuilt):
			// A state of the service, not a failure: the first build of
			// a read model takes about as long as a rebuild.
			c.Response().Header().Set("Retry-After", "5")
		case p.Status >= 500 && !errors.As(err, &own):
			if c.Request().Context().Err() == nil { // not a client that went away
				log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "status", p.Status, "err", err,
					"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "correlation_id", correlationID(c))
			}
			// Never send internals (hosts, connection strings) to clients.
			p.Detail = map[int]string{http.StatusServiceUnavailable: "a dependency is unavailable or the service is busy; retry later"}[p.Status]
		}
		c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
		_ = c.JSON(p.Status, p)
	}
}

// answered is the status of c's answer: the one written, or the one the
// error handler writes for err.
func answered(c echo.Context, err error) int {
	if err != nil {
		return toProblem(err).Status
	}
	return c.Response().Status
}

func toProblem(err error) Problem {
	var pe *problemError
	if errors.As(err, &pe) {
		return Problem{Type: "/problems/" + pe.slug, Title: titles[pe.slug], Status: pe.status, Detail: pe.detail, Errors: pe.fields}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		slug := cmp.Or(map[int]string{
			http.StatusNotFound: "route", http.StatusMethodNotAllowed: "method",
			http.StatusRequestEntityTooLarge: "too-large", http.StatusUnsupportedMediaType: "unsupported",
			http.StatusUnauthorized: "unauthorized", http.StatusBadRequest: "malformed",
			http.StatusTooManyRequests: "overloaded", http.StatusServiceUnavailable: "overloaded",
		}[he.Code], "internal")
		detail, _ := he.Message.(string)
		return Problem{Type: "/problems/" + slug, Title: titles[slug], Status: he.Code, Detail: detail}
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			p := Problem{Type: "/problems/" + c.slug, Title: c.title, Status: c.status, Detail: err.Error()}
			var ve *domain.ValidationError
			if errors.As(err, &ve) {
				p.Errors = ve.Fields
			}
			return p
		}
	}
	return Problem{Type: "/problems/internal", Title: titles["internal"], Status: http.StatusInternalServerError, Detail: err.Error()}
}
