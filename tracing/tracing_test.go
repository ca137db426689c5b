package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/tracing"
)

func TestSpanContext(t *testing.T) {
	if sc := tracing.SpanContext(""); sc.IsValid() {
		t.Errorf("SpanContext(\"\") = %v, want an invalid span context", sc)
	}
	sc := tracing.SpanContext("corr-1")
	tid, sid := domain.TraceIDs("corr-1")
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID() != tid || sc.SpanID() != sid {
		t.Errorf("SpanContext(corr-1) = %+v, want remote, sampled, trace %x span %x", sc, tid, sid)
	}
	if other := tracing.SpanContext("corr-2"); other.TraceID() == sc.TraceID() {
		t.Errorf("two correlation ids share trace %v", sc.TraceID())
	}
}

func TestInCorrelationTrace(t *testing.T) {
	ctx := context.Background()
	if got := tracing.InCorrelationTrace(ctx, ""); got != ctx {
		t.Errorf("InCorrelationTrace(ctx, \"\") returned another context")
	}
	got := trace.SpanContextFromContext(tracing.InCorrelationTrace(ctx, "corr-1"))
	if !got.Equal(tracing.SpanContext("corr-1")) {
		t.Errorf("span context in ctx = %+v, want SpanContext(corr-1)", got)
	}
}
