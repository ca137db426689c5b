package http

import (
	"context"
	"fmt"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
	"github.com/orderd/orderd/jobs"
)

// The admin routes answer 401 (/problems/unauthorized) without the
// Client's token, and 404 (/problems/route) when the server runs without
// an admin token. A job of another kind or projection than the route's is
// not found.

// Projections returns every projection's status and the outbox relay's
// owner, lease and checkpoint (GET /v1/admin/projections).
func (c *Client) Projections(ctx context.Context) (ProjectionsReport, error) {
	return answer[ProjectionsReport](c.api.ListProjections(ctx))
}

// StartRebuild starts a rebuild of the projection's read model with the
// scan of the log split into partitions (1 to jobs.MaxPartitions; 0
// leaves it to the server). It returns the job, or an *Error wrapping
// domain.ErrNotFound (unknown projection), domain.ErrValidation or
// domain.ErrJobRunning.
func (c *Client) StartRebuild(ctx context.Context, projection string, partitions int) (jobs.Job, error) {
	return answer[jobs.Job](c.api.StartRebuild(ctx, projection, api.RebuildRequest{Partitions: omitZero(partitions)}))
}

// SwitchBack points readers of projection back at the collection the last
// switch replaced, and returns the projection's state after it, or an
// *Error wrapping domain.ErrNotFound (unknown projection),
// domain.ErrNoPrevious or domain.ErrJobRunning.
func (c *Client) SwitchBack(ctx context.Context, projection string) (admin.ProjectionStatus, error) {
	return answer[admin.ProjectionStatus](c.api.SwitchBack(ctx, projection))
}

// StartVerify starts a verification of the projection's read model
// against the log, rewriting what differs when repair is set. It returns
// the job, or an *Error wrapping domain.ErrNotFound (unknown projection).
func (c *Client) StartVerify(ctx context.Context, projection string, repair bool) (jobs.Job, error) {
	return answer[jobs.Job](c.api.StartVerify(ctx, projection, api.VerifyRequest{Repair: &repair}))
}

// Job returns the job id of kind (jobs.KindRebuild or jobs.KindVerify)
// on projection, or an *Error wrapping domain.ErrNotFound; another kind
// is an error wrapping domain.ErrValidation, sending nothing.
func (c *Client) Job(ctx context.Context, kind jobs.JobKind, projection, id string) (jobs.Job, error) {
	if kind != jobs.KindRebuild && kind != jobs.KindVerify {
		return jobs.Job{}, fmt.Errorf("job kind %q: the client reads rebuilds and verifications: %w", kind, domain.ErrValidation)
	}
	get := c.api.GetRebuild
	if kind == jobs.KindVerify {
		get = c.api.GetVerification
	}
	return answer[jobs.Job](get(ctx, projection, id))
}

// CancelRebuild asks the rebuild id of projection to stop at its next
// checkpoint and returns it, or an *Error wrapping domain.ErrNotFound or
// domain.ErrJobFinished.
func (c *Client) CancelRebuild(ctx context.Context, projection, id string) (jobs.Job, error) {
	return answer[jobs.Job](c.api.CancelRebuild(ctx, projection, id))
}

// JobURL is the absolute URL of the job id of kind (jobs.KindRebuild or
// jobs.KindVerify) on projection, where a GET follows it.
func (c *Client) JobURL(kind jobs.JobKind, projection, id string) string {
	newRequest := api.NewGetRebuildRequest
	if kind == jobs.KindVerify {
		newRequest = api.NewGetVerificationRequest
	}
	req, err := newRequest(c.cfg.URL, projection, id)
	if err != nil {
		return "" // NewClient checked the URL
	}
	return req.URL.String()
}

// DeadLettersURL is the absolute URL of the projection's dead letters.
func (c *Client) DeadLettersURL(projection string) string {
	req, err := api.NewListDeadLettersRequest(c.cfg.URL, &api.ListDeadLettersParams{Projection: &projection})
	if err != nil {
		return "" // NewClient checked the URL
	}
	return req.URL.String()
}
