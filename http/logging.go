package http

import (
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
)

// logRequests writes one structured line per request with its request
// and correlation ids: at debug, so a healthy service under load keeps a
// quiet log, and at warn when it took longer than slow, but for an event
// stream (the log's tail), which lasts as long as its client keeps it
// open. 5xx answers are also logged, with their error, by the error
// handler.
func logRequests(log *slog.Logger, slow time.Duration) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			took := time.Since(start)
			req := c.Request()
			level := slog.LevelDebug
			if took > slow && c.Response().Header().Get(echo.HeaderContentType) != "text/event-stream" {
				level = slog.LevelWarn
			}
			if !log.Enabled(req.Context(), level) {
				return err
			}
			status := answered(c, err)
			log.Log(req.Context(), level, "request", "method", req.Method, "route", c.Path(), "status", status,
				"duration_ms", float64(took.Microseconds())/1000,
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "correlation_id", correlationID(c))
			return err
		}
	}
}
