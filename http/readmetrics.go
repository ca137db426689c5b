package http

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// readMetrics measures the read routes: every GET route under /v1, labelled
// by its route template (/v1/orders/:id, never the raw URL, so one order
// id is not one series). Requests that match no GET route are not
// counted: a scan of made-up URLs must not add series. It sits before the
// in-flight limit and the store guard, so their 503s count as errors of
// the route asked for.
type readMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec

	routesOnce sync.Once
	routes     map[string]bool // GET route templates under /v1
}

func newReadMetrics(reg prometheus.Registerer) *readMetrics {
	m := &readMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "orderd_read_request_duration_seconds",
			Help:    "Latency of read requests (GET under /v1) from routing to answer, in seconds, by route template.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"route"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderd_read_request_errors_total",
			Help: "Read requests (GET under /v1) answered 4xx or 5xx, by route template and status class."}, []string{"route", "class"}),
	}
	reg.MustRegister(m.duration, m.errors)
	return m
}

// middleware measures the requests of e's read routes. It reads e's
// routes at the first request, once every route is registered.
func (m *readMetrics) middleware(e *echo.Echo) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if c.Request().Method != http.MethodGet {
				return next(c)
			}
			m.routesOnce.Do(func() {
				m.routes = map[string]bool{}
				for _, r := range e.Routes() {
					// The log's tail is a stream as long as the page that
					// reads it, not a read with a latency.
					if r.Method == http.MethodGet && strings.HasPrefix(r.Path, "/v1/") && !strings.HasSuffix(r.Path, "*") && r.Path != "/v1/admin/log/tail" {
						m.routes[r.Path] = true
					}
				}
			})
			route := c.Path()
			if !m.routes[route] {
				return next(c)
			}
			start := time.Now()
			err := next(c)
			m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
			if status := answered(c, err); status >= 400 {
				m.errors.WithLabelValues(route, strconv.Itoa(status/100)+"xx").Inc()
			}
			return err
		}
	}
}
