package http

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// logRequests writes one structured line per request with its request
// and correlation ids: commands (POST) at info, reads at debug. 5xx
// answers are also logged, with their error, by the error handler.
func logRequests(log *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			req := c.Request()
			level := slog.LevelDebug
			if req.Method == http.MethodPost {
				level = slog.LevelInfo
			}
			if !log.Enabled(req.Context(), level) {
				return err
			}
			status := c.Response().Status
			if err != nil {
				status = toProblem(err).Status
			}
			log.Log(req.Context(), level, "request", "method", req.Method, "route", c.Path(), "status", status,
				"duration_ms", float64(time.Since(start).Microseconds())/1000,
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID), "correlation_id", correlationID(c))
			return err
		}
	}
}
