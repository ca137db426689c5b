// Package tracing puts the spans of every process that handles one
// command, the API, the relay and the projectors, into one OpenTelemetry
// trace without storing trace context in the event log: the trace id and
// the parent span id are derived from the command's correlation id
// (domain.TraceIDs), which every event carries.
//
// The event store and the outbox's publisher are traced by decorators
// wired in main (EventStore, Publisher), so neither adapter knows about
// tracing; the HTTP server and the projectors start their own spans.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
)

// SpanContext is the remote, sampled span context derived from a
// correlation id (domain.TraceIDs). It is not valid for "".
func SpanContext(correlationID string) trace.SpanContext {
	if correlationID == "" {
		return trace.SpanContext{}
	}
	tid, sid := domain.TraceIDs(correlationID)
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// InCorrelationTrace returns ctx with SpanContext(correlationID) as its
// remote parent, so spans started from it join the command's trace; ctx
// itself for "".
func InCorrelationTrace(ctx context.Context, correlationID string) context.Context {
	if correlationID == "" {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, SpanContext(correlationID))
}
