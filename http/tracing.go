package http

import (
	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/tracing"
)

// tracer records a server span per request through the global
// OpenTelemetry provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/http")

// traceRequests starts a server span for each request. A request that
// carries W3C trace context continues the caller's trace; any other joins
// the trace derived from its correlation id (X-Correlation-ID, else the
// request id: see tracing.SpanContext), where the relay's and the projectors'
// spans for the same events land too.
func traceRequests(next echo.HandlerFunc) echo.HandlerFunc {
	prop := propagation.TraceContext{}
	return func(c echo.Context) error {
		req := c.Request()
		correlation := correlationID(c)
		ctx := prop.Extract(req.Context(), propagation.HeaderCarrier(req.Header))
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", req.Method), attribute.String("http.route", c.Path()),
				attribute.String("orderd.correlation_id", correlation))}
		if correlation != "" {
			derived := tracing.SpanContext(correlation)
			if trace.SpanContextFromContext(ctx).IsValid() {
				// The caller's trace goes on; the events' trace is linked.
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: derived}))
			} else {
				ctx = trace.ContextWithRemoteSpanContext(ctx, derived)
			}
		}
		ctx, span := tracer.Start(ctx, "HTTP "+req.Method+" "+c.Path(), opts...)
		defer span.End()
		c.SetRequest(req.WithContext(ctx))
		err := next(c)
		status := answered(c, err)
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(otelcodes.Error, "")
		}
		return err
	}
}

// correlationID is the request's correlation id as the command service
// will record it: X-Correlation-ID when valid, else the request id.
func correlationID(c echo.Context) string {
	if id := c.Request().Header.Get("X-Correlation-ID"); token(id, 128) {
		return id
	}
	return c.Response().Header().Get(echo.HeaderXRequestID)
}
