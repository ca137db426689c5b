package tracing

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/outbox"
)

// Publisher decorates the outbox's publisher (outbox.Publisher,
// implemented by *bus.Publisher) with a producer span "relay.publish" per
// commit, in the trace of the commit's correlation id
// (InCorrelationTrace), so the relay's publish joins the command's trace
// in whichever process it happens.
type Publisher struct {
	outbox.Publisher
}

var _ outbox.Publisher = Publisher{}

// NewPublisher returns p with its publishes traced.
func NewPublisher(p outbox.Publisher) Publisher { return Publisher{p} }

// Send starts a span per commit and sends through the decorated
// publisher; its wait ends each span, as an error for a commit not
// acknowledged.
func (p Publisher) Send(ctx context.Context, commits []domain.RecordedCommit, positions []uint64, within time.Duration) func() ([]int, uint64, error) {
	spans := make([]trace.Span, len(commits))
	for i, c := range commits {
		_, spans[i] = tracer.Start(InCorrelationTrace(ctx, c.CorrelationID), "relay.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("orderd.stream_id", c.StreamID), attribute.Int64("orderd.first_version", c.FirstVersion),
				attribute.Int("orderd.events", len(c.Events)), attribute.String("orderd.correlation_id", c.CorrelationID)))
	}
	wait := p.Publisher.Send(ctx, commits, positions, within)
	return func() ([]int, uint64, error) {
		acked, seq, err := wait()
		done := make([]bool, len(commits))
		for _, k := range acked {
			done[k] = true
		}
		for i, span := range spans {
			if !done[i] {
				cause := err
				if cause == nil {
					cause = errors.New("not acknowledged")
				}
				span.SetStatus(codes.Error, cause.Error())
			}
			span.End()
		}
		return acked, seq, err
	}
}
