package http

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/http/api"
	"github.com/orderd/orderd/http/console"
	"github.com/orderd/orderd/jobs"
)

// operations is the Server as api.ServerInterface: one method per
// operation of openapi.json, each calling the Server's handler with the
// path and query parameters the generated wrapper bound.
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

func (r router) CONNECT(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodConnect, p, h, m...)
}

func (r router) DELETE(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodDelete, p, h, m...)
}

func (r router) GET(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodGet, p, h, m...)
}

func (r router) HEAD(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodHead, p, h, m...)
}

func (r router) OPTIONS(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodOptions, p, h, m...)
}

func (r router) PATCH(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPatch, p, h, m...)
}

func (r router) POST(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPost, p, h, m...)
}

func (r router) PUT(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodPut, p, h, m...)
}

func (r router) TRACE(p string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route {
	return r.add(http.MethodTrace, p, h, m...)
}

// text is the value of an optional parameter, "" when it was not given.
func text(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (o operations) GetHealth(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (o operations) GetReadiness(c echo.Context) error { return o.ready(c) }
func (o operations) GetMetrics(c echo.Context) error   { return o.metricsPage(c) }
func (o operations) GetOpenAPI(c echo.Context) error   { return openAPIDocument(c) }

// RedirectToConsole sends the address people type to the console's page:
// its relative links need the slash.
func (o operations) RedirectToConsole(c echo.Context) error {
	return c.Redirect(http.StatusMovedPermanently, console.Prefix)
}

// GetConsoleFile serves the console's page, script or style sheet; any
// other name is an unknown route.
func (o operations) GetConsoleFile(c echo.Context, file api.GetConsoleFileParamsFile) error {
	if !file.Valid() {
		return echo.ErrNotFound
	}
	return o.consolePage(c)
}

func (o operations) PlaceOrder(c echo.Context) error { return o.place(c) }

func (o operations) ApproveOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "approve")
}

func (o operations) InvoiceOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "invoice")
}

func (o operations) ProcessOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "process")
}

func (o operations) ShipOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "ship")
}

func (o operations) DeliverOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "deliver")
}

func (o operations) CancelOrder(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "cancel")
}

func (o operations) MarkOrderUnavailable(c echo.Context, id api.OrderId) error {
	return o.lifecycle(c, id, "mark-unavailable")
}

func (o operations) GetOrder(c echo.Context, id api.OrderId, p api.GetOrderParams) error {
	return o.getOrder(c, id, p.AsOfVersion, p.AsOf)
}

func (o operations) GetOrderEvents(c echo.Context, id api.OrderId, p api.GetOrderEventsParams) error {
	return o.getEvents(c, id, p.AsOfVersion, p.AsOf)
}

func (o operations) GetOrderSummary(c echo.Context, id api.OrderId, p api.GetOrderSummaryParams) error {
	return o.getSummary(c, id, text(p.MinVersion), text(p.Wait))
}

func (o operations) ListOrderSummaries(c echo.Context, p api.ListOrderSummariesParams) error {
	return o.listSummaries(c, text(p.CustomerId), text((*string)(p.Status)), text(p.Limit), text(p.Cursor))
}

func (o operations) GetCustomerOrderStats(c echo.Context, id api.CustomerId) error {
	return o.customerStats(c, id)
}

func (o operations) GetDailySales(c echo.Context, p api.GetDailySalesParams) error {
	return o.dailySales(c, text(p.From), text(p.To), text(p.Currency))
}

func (o operations) ListProjections(c echo.Context) error { return o.listProjections(c) }

func (o operations) StartRebuild(c echo.Context, name api.Projection) error {
	return o.startRebuild(c, name)
}

func (o operations) GetRebuild(c echo.Context, name api.Projection, job api.JobId) error {
	return o.getJob(c, jobs.KindRebuild, name, job)
}

func (o operations) CancelRebuild(c echo.Context, name api.Projection, job api.JobId) error {
	return o.cancelJob(c, jobs.KindRebuild, name, job)
}

func (o operations) SwitchBack(c echo.Context, name api.Projection) error {
	return o.switchBack(c, name)
}

func (o operations) StartVerify(c echo.Context, name api.Projection) error {
	return o.startVerify(c, name)
}

func (o operations) GetVerification(c echo.Context, name api.Projection, job api.JobId) error {
	return o.getJob(c, jobs.KindVerify, name, job)
}

func (o operations) CancelVerification(c echo.Context, name api.Projection, job api.JobId) error {
	return o.cancelJob(c, jobs.KindVerify, name, job)
}

func (o operations) StartReplay(c echo.Context) error { return o.startReplay(c) }

func (o operations) GetReplay(c echo.Context, job api.JobId) error {
	return o.getJob(c, jobs.KindReplay, "", job)
}

func (o operations) CancelReplay(c echo.Context, job api.JobId) error {
	return o.cancelJob(c, jobs.KindReplay, "", job)
}

func (o operations) ListDeadLetters(c echo.Context, p api.ListDeadLettersParams) error {
	return o.listDeadLetters(c, text(p.Projection), text(p.Limit))
}

func (o operations) RetryDeadLetter(c echo.Context, id api.DeadLetterId) error {
	return o.retryDeadLetter(c, id)
}

func (o operations) GetOrderReadModels(c echo.Context, id api.OrderId) error {
	return o.readModels(c, id)
}

func (o operations) ListLog(c echo.Context, p api.ListLogParams) error { return o.listLog(c, p) }

func (o operations) GetLogCommit(c echo.Context, id string) error { return o.getLogCommit(c, id) }

func (o operations) TailLog(c echo.Context, p api.TailLogParams) error { return o.tailLog(c, p) }

func (o operations) GetHistory(c echo.Context) error { return o.getHistory(c) }
