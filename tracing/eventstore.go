package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
)

// tracer records the spans of the decorators through the global
// OpenTelemetry provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/tracing")

// EventStore decorates a domain.EventStore with a client span
// "eventstore.append" around each append, a child of the caller's span
// (the request's). Loads and key look-ups pass through untraced.
type EventStore struct {
	domain.EventStore
}

var _ domain.EventStore = EventStore{}

// NewEventStore returns s with its appends traced.
func NewEventStore(s domain.EventStore) EventStore { return EventStore{s} }

// Append appends through the decorated store inside the span; a failed
// append marks the span as an error.
func (s EventStore) Append(ctx context.Context, c domain.Commit) (time.Time, error) {
	ctx, span := tracer.Start(ctx, "eventstore.append", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("orderd.stream_id", c.StreamID), attribute.Int64("orderd.expected_version", c.ExpectedVersion),
		attribute.Int("orderd.events", len(c.Events))))
	defer span.End()
	at, err := s.EventStore.Append(ctx, c)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return at, err
}
