package eventstore

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
)

// tracer records the event store's and the relay's spans through the
// global OpenTelemetry provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/eventstore")

// inCorrelationTrace returns ctx under the trace derived from a
// correlation id (domain.TraceIDs), so the relay's spans join the trace of
// the command that appended the events.
func inCorrelationTrace(ctx context.Context, correlationID string) context.Context {
	if correlationID == "" {
		return ctx
	}
	tid, sid := domain.TraceIDs(correlationID)
	return trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
}
