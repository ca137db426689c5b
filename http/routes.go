package http

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/http/api"
	"github.com/orderd/orderd/http/console"
	"github.com/orderd/orderd/jobs"
)

// operations is the Server as api.ServerInterface: one handler per
// operation of openapi.json, named by its operationId, which gets the path
// and query parameters the generated wrapper bound.
type operations struct {
	*Server
	metricsPage echo.HandlerFunc // GET /metrics, nil without a Gatherer
	consolePage echo.HandlerFunc // the console's files
}

var _ api.ServerInterface = operations{}

// router is where api.RegisterHandlers registers the document's routes on
// the server's echo. It leaves out what this server does not serve: with
// OpsOnly all but /healthz, /readyz and /metrics; /metrics without a
// Gatherer; the admin routes and the console without an admin token.
// Those answer 404 like any unknown path. The admin routes go to admin,
// the group behind the bearer token.
type router struct {
	// The other methods of api.EchoRouter: the document has routes of
	// GET and POST only, and this is nil, so that a route of another
	// method panics in NewServer instead of being registered unfiltered.
	api.EchoRouter
	echo  *echo.Echo
	admin *echo.Group // nil: no admin routes, no console
	cfg   *Config
}

var _ api.EchoRouter = router{}

func (r router) add(method, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	switch {
	case path == "/healthz" || path == "/readyz":
	case path == "/metrics":
		if r.cfg.Gatherer == nil {
			return nil
		}
	case r.cfg.OpsOnly:
		return nil
	case strings.HasPrefix(path, "/v1/admin/"):
		if r.admin == nil {
			return nil
		}
		return r.admin.Add(method, strings.TrimPrefix(path, "/v1/admin"), h, m...)
	case path == strings.TrimSuffix(console.Prefix, "/") || strings.HasPrefix(path, console.Prefix):
		if r.admin == nil {
			return nil
		}
		if path == console.Prefix+":file" {
			// The page is also at /console/, where its relative links
			// resolve; the document names it only as index.html, since it
			// names no path with a trailing slash.
			r.echo.Add(method, console.Prefix, func(c echo.Context) error {
				c.SetParamNames("file")
				c.SetParamValues(string(api.IndexHtml))
				return h(c)
			}, m...)
		}
	}
	return r.echo.Add(method, path, h, m...)
}

// GET and POST are the only methods of the document's routes.
func (r router) GET(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodGet, p, h, m...)
}

func (r router) POST(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPost, p, h, m...)
}

// text is the value of an optional parameter, "" when it was not given.
func text(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (s operations) GetHealth(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s operations) GetMetrics(c echo.Context) error { return s.metricsPage(c) }

// RedirectToConsole sends the address people type to the console's page:
// its relative links need the slash.
func (s operations) RedirectToConsole(c echo.Context) error {
	return c.Redirect(http.StatusMovedPermanently, console.Prefix)
}

// GetConsoleFile serves the console's page, script or style sheet; any
// other name is an unknown route.
func (s operations) GetConsoleFile(c echo.Context, file api.GetConsoleFileParamsFile) error {
	if !file.Valid() {
		return echo.ErrNotFound
	}
	return s.consolePage(c)
}

func (s operations) GetRebuild(c echo.Context, name api.Projection, job api.JobId) error {
	return s.getJob(c, jobs.KindRebuild, name, job)
}

func (s operations) CancelRebuild(c echo.Context, name api.Projection, job api.JobId) error {
	return s.cancelJob(c, jobs.KindRebuild, name, job)
}

func (s operations) GetVerification(c echo.Context, name api.Projection, job api.JobId) error {
	return s.getJob(c, jobs.KindVerify, name, job)
}

func (s operations) CancelVerification(c echo.Context, name api.Projection, job api.JobId) error {
	return s.cancelJob(c, jobs.KindVerify, name, job)
}

func (s operations) GetReplay(c echo.Context, job api.JobId) error {
	return s.getJob(c, jobs.KindReplay, "", job)
}

func (s operations) CancelReplay(c echo.Context, job api.JobId) error {
	return s.cancelJob(c, jobs.KindReplay, "", job)
}
