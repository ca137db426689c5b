package http

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
	"github.com/orderd/orderd/http/console"
)

// Commands is the command side as the API needs it (domain.Service).
type Commands interface {
	Execute(ctx context.Context, orderID string, cmd domain.Command, opt domain.ExecOptions) (domain.Result, error)
	Get(ctx context.Context, orderID string) (domain.Order, error)
	EventsUntil(ctx context.Context, orderID string, b domain.Bound) (domain.Order, []domain.Event, error)
}

// ReadModels is the query side (mongodb.Reader). Summary and
// CustomerStats return errors wrapping domain.ErrNotFound for unknown ids.
type ReadModels interface {
	Summary(ctx context.Context, orderID string) (domain.Order, error)
	ListSummaries(ctx context.Context, customerID, status, after string, limit int) ([]domain.Order, error)
	CustomerStats(ctx context.Context, customerID string) (domain.CustomerOrderStats, error)
	// DailySales returns the sales per purchase day over the UTC dates
	// from to to, both included, of one currency unless currency is empty;
	// rows sorted by day then currency; and the projection that answered
	// (its lag is the answer's Read-Model-Lag).
	DailySales(ctx context.Context, from, to time.Time, currency string) (days []domain.DailySales, projection string, err error)
}

// Check is a readiness probe of one dependency; nil means reachable.
type Check func(ctx context.Context) error

// StoreGuard bounds a request by the store's reachability
// (mongodb.Reachability): Bound returns an error wrapping
// domain.ErrUnavailable while the store is known to be down, and otherwise
// a context cancelled, with domain.ErrUnavailable as its cause, if the
// store goes down during the request.
type StoreGuard interface {
	Bound(ctx context.Context) (context.Context, context.CancelFunc, error)
}

// Config configures a Server. Zero durations take the defaults in brackets.
type Config struct {
	// OpsOnly serves only /healthz, /readyz and /metrics, for an instance
	// without the api role; Commands, ReadModels and Admin are unused then.
	OpsOnly bool

	Commands   Commands
	ReadModels ReadModels
	Ready      map[string]Check // checked by /readyz: what this instance's roles need, e.g. "store", "bus"
	Store      StoreGuard       // optional: answer /v1 requests 503 at once while the store is down
	// Lag (optional) sets Read-Model-Lag on read-model answers, and
	// commands are admitted by it: with MaxLag > 0 they are refused with
	// 503 and Retry-After while the slowest read model is more than
	// MaxLag events behind (admit); 0 takes them whatever the lag.
	Lag        ProjectionLag
	MaxLag     int
	Gatherer   prometheus.Gatherer
	Registerer prometheus.Registerer
	Log        *slog.Logger
	Admin      Admin  // the admin routes, registered only with AdminToken
	AdminToken string // bearer token of the admin routes

	SummaryWait time.Duration // default bound of ?min_version waits [5s]
	MaxInFlight int           // concurrent requests before 503 [1024]
	MaxWaits    int           // concurrent ?min_version waits before 503 [256]
	// SlowRequest is how long a request may take before its log line is
	// a warning rather than debug [1s].
	SlowRequest time.Duration

	// Slow clients: the request line and headers must arrive within
	// ReadHeaderTimeout [5s], the whole request within ReadTimeout [30s];
	// an idle keep-alive connection is closed after IdleTimeout [120s].
	// Writes may take maxSummaryWait + 30s.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
}

// maxBodyBytes bounds a request's body; a larger one is answered 413.
const maxBodyBytes = 1 << 20

// maxSummaryWait is the largest ?wait of GET /v1/order-summaries/{id}.
const maxSummaryWait = 30 * time.Second

// setDefaults fills in the zero fields with the defaults in brackets.
func (c *Config) setDefaults() {
	if c.SummaryWait <= 0 {
		c.SummaryWait = 5 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1024
	}
	if c.MaxWaits <= 0 {
		c.MaxWaits = 256
	}
	if c.SlowRequest <= 0 {
		c.SlowRequest = time.Second
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 5 * time.Second
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// Server is the REST API (docs/api.md) on echo.
type Server struct {
	echo    *echo.Echo
	http    *http.Server
	cfg     Config
	metrics *metrics
	watch   *summaryWatch
	// closing ends when Shutdown starts: it ends the event streams,
	// which would otherwise hold Shutdown until its context ran out.
	closing context.Context
}

// NewServer registers the routes of openapi.json (see router): the REST
// API with health, readiness and metrics, or only the last three when
// cfg.OpsOnly.
func NewServer(cfg Config) *Server {
	cfg.setDefaults()
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(cfg.Log)
	e.JSONSerializer = jsonSerializer{}
	closing, startClosing := context.WithCancel(context.Background())
	s := &Server{echo: e, cfg: cfg, metrics: newMetrics(cfg.Registerer), watch: newSummaryWatch(cfg.ReadModels, cfg.MaxWaits), closing: closing}
	if cfg.Lag != nil && cfg.MaxLag > 0 {
		registerAdmission(cfg.Registerer, cfg.Lag, cfg.MaxLag)
	}
	s.http = &http.Server{
		Handler:           e,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      maxSummaryWait + 30*time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
	}
	s.http.RegisterOnShutdown(startClosing)
	// The body limit is the server's, not /v1's: echo answers any method
	// on any path under a group with middleware (a catch-all route it adds
	// for them), so a wrong method there got 404, not 405 with Allow. No
	// route outside /v1 takes a body. The admin group keeps its token
	// check: before it, nothing tells which admin routes exist.
	e.Use(middleware.Recover(), dropInvalidRequestID, middleware.RequestID(), traceRequests, logRequests(cfg.Log, cfg.SlowRequest), newReadMetrics(cfg.Registerer).middleware(e), inFlightLimit(cfg.MaxInFlight), storeGuard(cfg.Store),
		answerTooLarge(tooLargeDiscard*maxBodyBytes), middleware.BodyLimit(strconv.Itoa(maxBodyBytes)))

	ops := operations{Server: s, consolePage: echo.WrapHandler(console.Handler())}
	if cfg.Gatherer != nil {
		ops.metricsPage = echo.WrapHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	r := router{echo: e, cfg: &s.cfg}
	if !cfg.OpsOnly && cfg.Admin != nil && cfg.AdminToken != "" {
		r.admin = e.Group("/v1/admin", bearer(cfg.AdminToken))
	}
	api.RegisterHandlers(r, ops)
	return s
}

// Handler returns the API as an http.Handler.
func (s *Server) Handler() http.Handler { return s.echo }

// Serve serves on ln with timeouts against slow clients until Shutdown.
// It returns nil after Shutdown.
// A Shutdown before Serve makes Serve return at once.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting requests and waits for those in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.http.Shutdown(ctx)
}

// GetReadiness answers /readyz: 200 when every check of Config.Ready
// passes, else 503; the body maps each check's name to "ok" or "unavailable".
func (s operations) GetReadiness(c echo.Context) error {
	status, body := http.StatusOK, map[string]string{}
	for name, check := range s.cfg.Ready {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		err := check(ctx)
		cancel()
		body[name] = "ok"
		if err != nil {
			status, body[name] = http.StatusServiceUnavailable, "unavailable"
			s.cfg.Log.Warn("readiness check failed", "check", name, "err", err)
		}
	}
	return c.JSON(status, body)
}

// dropInvalidRequestID removes a client's X-Request-Id unless it is a
// short visible-ASCII token: the request id becomes the causation id of
// the events, stored in the log and sent to every consumer.
func dropInvalidRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if id := h.Get(echo.HeaderXRequestID); id != "" && !token(id, 128) {
			h.Del(echo.HeaderXRequestID)
		}
		return next(c)
	}
}

// tooLargeDiscard is how many times the body limit answerTooLarge reads
// and discards of a refused body: a client that sent a few times the
// limit gets its 413; one that sends more finds the connection closed.
const tooLargeDiscard = 16

// answerTooLarge sends a 413 (the body limit's, before or during the
// read of the body) at once with Connection: close, then reads and
// discards up to max bytes of the body, within the server's ReadTimeout.
// A client that sends its whole body before it reads the answer (Python's
// http.client, and requests on it) otherwise saw its write fail with a
// broken pipe: a server that closes a connection with unread data resets
// it. A client that waits for 100 Continue sends no body after a final
// answer, so none is read.
func answerTooLarge(max int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			body := c.Request().Body // before the limit wraps it
			err := next(c)
			var he *echo.HTTPError
			if !errors.As(err, &he) || he.Code != http.StatusRequestEntityTooLarge || c.Response().Committed {
				return err
			}
			c.Response().Header().Set(echo.HeaderConnection, "close")
			c.Error(err)
			if strings.EqualFold(c.Request().Header.Get("Expect"), "100-continue") {
				return nil
			}
			c.Response().Flush()
			_, _ = io.CopyN(io.Discard, body, max)
			return nil
		}
	}
}

// inFlightLimit answers 503 instead of queueing when max requests are
// already being served. /healthz, /readyz and /metrics are never limited:
// a liveness probe refused while the instance is only busy would have the
// kubelet restart it, dropping its relay queue and every request in
// flight.
func inFlightLimit(max int) echo.MiddlewareFunc {
	sem := make(chan struct{}, max)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			switch c.Request().URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return next(c)
			}
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
				return next(c)
			default:
				return echo.NewHTTPError(http.StatusServiceUnavailable, "too many requests in flight; retry")
			}
		}
	}
}

// storeGuard answers /v1 requests unavailable at once while the store is
// known to be down, and turns a request cancelled because the store went
// down into the same answer, instead of letting each wait out the
// driver's server selection.
func storeGuard(g StoreGuard) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		if g == nil {
			return next
		}
		return func(c echo.Context) error {
			if !strings.HasPrefix(c.Request().URL.Path, "/v1/") {
				return next(c)
			}
			ctx, done, err := g.Bound(c.Request().Context())
			if err != nil {
				return err
			}
			defer done()
			c.SetRequest(c.Request().WithContext(ctx))
			err = next(c)
			if cause := context.Cause(ctx); err != nil && errors.Is(cause, domain.ErrUnavailable) {
				return cause
			}
			return err
		}
	}
}
