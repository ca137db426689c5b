package http

import (
	"context"
	"net/http"
	"net/url"

	"github.com/orderd/orderd/domain"
)

// The admin routes answer 401 (/problems/unauthorized) without the
// Client's token, and 404 (/problems/route) when the server runs without
// an admin token. A job of another kind or projection than the route's is
// not found.

// Projections returns every projection's status
// (GET /v1/admin/projections).
func (c *Client) Projections(ctx context.Context) ([]domain.ProjectionStatus, error) {
	var list struct {
		Projections []domain.ProjectionStatus `json:"projections"`
	}
	_, err := c.do(ctx, http.MethodGet, "/v1/admin/projections", nil, nil, &list)
	return list.Projections, err
}

// StartRebuild starts a rebuild of the projection's read model with the
// scan of the log split into partitions (1 to domain.MaxPartitions; 0
// leaves it to the server). It returns the job, or an *Error wrapping
// domain.ErrNotFound (unknown projection), domain.ErrValidation or
// domain.ErrJobRunning.
func (c *Client) StartRebuild(ctx context.Context, projection string, partitions int) (domain.Job, error) {
	var body any = struct{}{}
	if partitions > 0 {
		body = map[string]int{"partitions": partitions}
	}
	var job domain.Job
	_, err := c.do(ctx, http.MethodPost, jobsPath(domain.KindRebuild, projection), nil, body, &job)
	return job, err
}

// SwitchBack points readers of projection back at the collection the last
// switch replaced, and returns the projection's state after it, or an
// *Error wrapping domain.ErrNotFound (unknown projection),
// domain.ErrNoPrevious or domain.ErrJobRunning.
func (c *Client) SwitchBack(ctx context.Context, projection string) (domain.ProjectionStatus, error) {
	var st domain.ProjectionStatus
	_, err := c.do(ctx, http.MethodPost, "/v1/admin/projections/"+url.PathEscape(projection)+"/switch-back", nil, struct{}{}, &st)
	return st, err
}

// StartVerify starts a verification of the projection's read model
// against the log, rewriting what differs when repair is set. It returns
// the job, or an *Error wrapping domain.ErrNotFound (unknown projection).
func (c *Client) StartVerify(ctx context.Context, projection string, repair bool) (domain.Job, error) {
	var job domain.Job
	_, err := c.do(ctx, http.MethodPost, jobsPath(domain.KindVerify, projection), nil, map[string]bool{"repair": repair}, &job)
	return job, err
}

// Job returns the job id of kind on projection ("" for a replay), or an
// *Error wrapping domain.ErrNotFound.
func (c *Client) Job(ctx context.Context, kind domain.JobKind, projection, id string) (domain.Job, error) {
	var job domain.Job
	_, err := c.do(ctx, http.MethodGet, jobPath(kind, projection, id), nil, nil, &job)
	return job, err
}

// CancelJob asks the job to stop at its next checkpoint and returns it, or
// an *Error wrapping domain.ErrNotFound or domain.ErrJobFinished.
func (c *Client) CancelJob(ctx context.Context, kind domain.JobKind, projection, id string) (domain.Job, error) {
	var job domain.Job
	_, err := c.do(ctx, http.MethodPost, jobPath(kind, projection, id)+"/cancel", nil, nil, &job)
	return job, err
}

// JobURL is the absolute URL of the job, where a GET follows it.
func (c *Client) JobURL(kind domain.JobKind, projection, id string) string {
	return c.URL(jobPath(kind, projection, id))
}

// DeadLettersURL is the absolute URL of the projection's dead letters.
func (c *Client) DeadLettersURL(projection string) string {
	return c.URL("/v1/admin/dead-letters?projection=" + url.QueryEscape(projection))
}

// jobsPath is the collection of the jobs of kind on projection.
func jobsPath(kind domain.JobKind, projection string) string {
	switch kind {
	case domain.KindRebuild:
		return "/v1/admin/projections/" + url.PathEscape(projection) + "/rebuilds"
	case domain.KindVerify:
		return "/v1/admin/projections/" + url.PathEscape(projection) + "/verifications"
	}
	return "/v1/admin/replays"
}

func jobPath(kind domain.JobKind, projection, id string) string {
	return jobsPath(kind, projection) + "/" + url.PathEscape(id)
}
