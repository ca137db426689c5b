package http

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// Admin is the operator side (the repair jobs and dead letters). Methods
// return errors wrapping domain.ErrNotFound (unknown projection, job or
// dead letter), domain.ErrValidation, domain.ErrJobRunning,
// domain.ErrJobFinished, domain.ErrOtherVersion, domain.ErrNotBuilt or
// domain.ErrNoPrevious.
type Admin interface {
	StartRebuild(ctx context.Context, projection string, partitions int) (jobs.Job, error)
	StartVerify(ctx context.Context, projection string, repair bool) (jobs.Job, error)
	// SwitchBack points readers back at the projection's previous
	// collection and returns the projection's state after it.
	SwitchBack(ctx context.Context, projection string) (admin.ProjectionStatus, error)
	StartReplay(ctx context.Context, spec jobs.ReplaySpec) (jobs.Job, error)
	Job(ctx context.Context, id string) (jobs.Job, error)
	CancelJob(ctx context.Context, id string) (jobs.Job, error)
	Projections(ctx context.Context) ([]admin.ProjectionStatus, error)
	// Relay returns the outbox relay's owner, lease and checkpoint.
	Relay(ctx context.Context) (outbox.RelayStatus, error)
	DeadLetters(ctx context.Context, projection string, limit int64) ([]projector.DeadLetter, error)
	RetryDeadLetter(ctx context.Context, id string) error
	// ReadModels returns each read model's document of an order beside
	// the fold of its log (projection.ReadModelCheck), or an error wrapping
	// domain.ErrNotFound when neither the log nor any read model has it.
	ReadModels(ctx context.Context, orderID string) ([]projection.ReadModelCheck, error)
	// Browse returns a page of the event log, newest commit first
	// (domain.LogQuery, domain.LogPage), or an error wrapping
	// domain.ErrValidation for a cursor of another query.
	Browse(ctx context.Context, q domain.LogQuery) (domain.LogPage, error)
	// LogCommit returns one commit of the log by id
	// ("<stream id>:<first version, 10 digits>"); found is false when the
	// log has none.
	LogCommit(ctx context.Context, id string) (c domain.LogCommit, found bool, err error)
	// TailLog follows the log's change stream: it calls fn with nil once
	// the stream is open (every commit recorded after that reaches fn)
	// and again about every second while nothing happens, and with each
	// commit recorded since, in commit order. It returns nil when ctx
	// ends, fn's error, or an error when the stream fails or fn fell too
	// far behind the log.
	TailLog(ctx context.Context, fn func(*domain.LogCommit) error) error
	// History returns the projections' and the relay's samples kept by
	// the admin service, oldest first.
	History(ctx context.Context) (admin.History, error)
}

// bearer admits requests carrying "Authorization: Bearer <token>". The
// comparison is of SHA-256 digests in constant time, so neither the
// token's bytes nor its length leak through timing.
func bearer(token string) echo.MiddlewareFunc {
	want := sha256.Sum256([]byte(token))
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			scheme, got, ok := strings.Cut(c.Request().Header.Get(echo.HeaderAuthorization), " ")
			sum := sha256.Sum256([]byte(strings.TrimLeft(got, " "))) // RFC 6750: one or more spaces
			if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="orderd admin"`)
				return echo.NewHTTPError(http.StatusUnauthorized, "admin routes need Authorization: Bearer <ADMIN_TOKEN>")
			}
			return next(c)
		}
	}
}

func (s operations) ListProjections(c echo.Context) error {
	ps, err := s.cfg.Admin.Projections(c.Request().Context())
	if err != nil {
		return err
	}
	relay, err := s.cfg.Admin.Relay(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ProjectionsReport{Projections: ps, Relay: relay})
}

// ProjectionsReport is the answer of GET /v1/admin/projections: every
// projection's status, and the outbox relay's owner, lease and checkpoint
// (zero before any relay started).
type ProjectionsReport struct {
	Projections []admin.ProjectionStatus `json:"projections"`
	Relay       outbox.RelayStatus       `json:"relay"`
}

type rebuildRequest struct {
	Partitions *int `json:"partitions" validate:"omitempty,min=1,max=64"`
}

func (s operations) StartRebuild(c echo.Context, projection api.Projection) error {
	var req rebuildRequest
	if err := decode(c, &req, true); err != nil {
		return err
	}
	n := 1
	if req.Partitions != nil {
		n = *req.Partitions
	}
	job, err := s.cfg.Admin.StartRebuild(c.Request().Context(), projection, n)
	if err != nil {
		return err
	}
	return accepted(c, job, "/v1/admin/projections/"+job.Projection+"/rebuilds/"+job.ID)
}

func (s operations) SwitchBack(c echo.Context, projection api.Projection) error {
	var req struct{}
	if err := decode(c, &req, true); err != nil {
		return err
	}
	st, err := s.cfg.Admin.SwitchBack(c.Request().Context(), projection)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

type verifyRequest struct {
	Repair bool `json:"repair"`
}

func (s operations) StartVerify(c echo.Context, projection api.Projection) error {
	var req verifyRequest
	if err := decode(c, &req, true); err != nil {
		return err
	}
	job, err := s.cfg.Admin.StartVerify(c.Request().Context(), projection, req.Repair)
	if err != nil {
		return err
	}
	return accepted(c, job, "/v1/admin/projections/"+job.Projection+"/verifications/"+job.ID)
}

type replayRequest struct {
	StreamID string `json:"stream_id" validate:"omitempty,id"`
	From     string `json:"from" validate:"omitempty,rfc3339"`
	To       string `json:"to" validate:"omitempty,rfc3339"`
}

func (s operations) StartReplay(c echo.Context) error {
	var req replayRequest
	if err := decode(c, &req, false); err != nil {
		return err
	}
	job, err := s.cfg.Admin.StartReplay(c.Request().Context(), jobs.ReplaySpec{
		StreamID: req.StreamID, From: parseTime(req.From), To: parseTime(req.To)})
	if err != nil {
		return err
	}
	return accepted(c, job, "/v1/admin/replays/"+job.ID)
}

func accepted(c echo.Context, job jobs.Job, location string) error {
	c.Response().Header().Set(echo.HeaderLocation, location)
	return c.JSON(http.StatusAccepted, job)
}

// job returns the job id, or not found when it is of another kind or
// projection ("" for a replay) than the route's.
func (s *Server) job(c echo.Context, kind jobs.JobKind, projection, id string) (jobs.Job, error) {
	job, err := s.cfg.Admin.Job(c.Request().Context(), id)
	if err != nil {
		return job, err
	}
	if job.Kind != kind || job.Projection != projection {
		return job, fmt.Errorf("%s job %s: %w", kind, id, domain.ErrNotFound)
	}
	return job, nil
}

func (s *Server) getJob(c echo.Context, kind jobs.JobKind, projection, id string) error {
	job, err := s.job(c, kind, projection, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, job)
}

func (s *Server) cancelJob(c echo.Context, kind jobs.JobKind, projection, id string) error {
	if _, err := s.job(c, kind, projection, id); err != nil {
		return err
	}
	job, err := s.cfg.Admin.CancelJob(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, job)
}

func (s operations) ListDeadLetters(c echo.Context, p api.ListDeadLettersParams) error {
	limit := int64(100)
	if v := text(p.Limit); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > 1000 {
			return invalid(domain.FieldError{Field: "limit", Detail: "a whole number from 1 to 1000"})
		}
		limit = n
	}
	ds, err := s.cfg.Admin.DeadLetters(c.Request().Context(), text(p.Projection), limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"dead_letters": ds})
}

func (s operations) RetryDeadLetter(c echo.Context, id api.DeadLetterId) error {
	if err := s.cfg.Admin.RetryDeadLetter(c.Request().Context(), id); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]string{"id": id, "result": "applied"})
}

func (s operations) GetOrderReadModels(c echo.Context, id api.OrderId) error {
	if err := validID("order id", id); err != nil {
		return err
	}
	rs, err := s.cfg.Admin.ReadModels(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"order_id": id, "read_models": rs})
}
