package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	"github.com/orderd/orderd/tracing"
)

// recorder is the global tracer provider's span processor for this test
// binary: the decorators' tracer is bound to the first provider installed.
var recorder = sync.OnceValue(func() *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	return rec
})

// unique returns a stream id of this test's run alone.
func unique(t *testing.T) string { return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()) }

// spans returns the ended spans named name about stream.
func spans(name, stream string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range recorder().Ended() {
		for _, a := range sp.Attributes() {
			if sp.Name() == name && a.Key == "orderd.stream_id" && a.Value.AsString() == stream {
				out = append(out, sp)
			}
		}
	}
	return out
}

func TestEventStoreTracesAppends(t *testing.T) {
	recorder()
	stream := unique(t)
	s := tracing.NewEventStore(domaintest.NewMemStore())
	ctx, parent := otel.Tracer("test").Start(context.Background(), "request")
	e := domain.Event{ID: "e1", StreamID: stream, StreamType: domain.StreamTypeOrder, Type: domain.OrderApproved{}.EventType(),
		Version: 1, OccurredAt: time.Now(), Data: domain.OrderApproved{}}
	c := domain.Commit{StreamID: stream, StreamType: domain.StreamTypeOrder, Events: []domain.Event{e}}
	if _, err := s.Append(ctx, c); err != nil {
		t.Fatalf("append: %v", err)
	}
	if _, err := s.Append(ctx, c); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("second append at v0: %v, want a version conflict", err)
	}
	if evs, err := s.Load(ctx, stream, 0); err != nil || len(evs) != 1 {
		t.Fatalf("load through the decorator: %d events, %v", len(evs), err)
	}
	parent.End()

	appends := spans("eventstore.append", stream)
	if len(appends) != 2 {
		t.Fatalf("%d append spans, want 2 (loads are not traced)", len(appends))
	}
	for i, sp := range appends {
		if sp.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("append %d: parent %s, want the request's span", i, sp.Parent().SpanID())
		}
	}
	if appends[0].Status().Code == codes.Error || appends[1].Status().Code != codes.Error {
		t.Errorf("append statuses %v, %v; want the conflict's span only marked as an error", appends[0].Status(), appends[1].Status())
	}
}

// acking acknowledges the commits whose index it names.
type acking struct{ acked []int }

func (p acking) Send(context.Context, []domain.RecordedCommit, []uint64, time.Duration) func() ([]int, uint64, error) {
	return func() ([]int, uint64, error) { return p.acked, 0, errors.New("ack timeout") }
}
func (p acking) Connected() bool                   { return true }
func (p acking) CheckStream(context.Context) error { return nil }
func (p acking) Positions(context.Context, time.Time, uint64) (map[string]uint64, uint64, error) {
	return nil, 0, nil
}

func TestPublisherSpanPerCommitInItsCorrelationTrace(t *testing.T) {
	recorder()
	name := unique(t)
	commit := func(stream, correlation string) domain.RecordedCommit {
		return domain.RecordedCommit{StreamID: stream, FirstVersion: 1, CorrelationID: correlation, Events: []domain.EventMessage{{ID: stream + "-1"}}}
	}
	p := tracing.NewPublisher(acking{acked: []int{1}})
	acked, _, err := p.Send(context.Background(), []domain.RecordedCommit{commit(name+"-a", "corr-a"), commit(name+"-b", "corr-b")}, nil, time.Second)()
	if err == nil || len(acked) != 1 || acked[0] != 1 {
		t.Fatalf("publish: %v, %v; want the decorated publisher's answer", acked, err)
	}
	var published []sdktrace.ReadOnlySpan
	for _, sfx := range []string{"-a", "-b"} {
		sps := spans("relay.publish", name+sfx)
		if len(sps) != 1 {
			t.Fatalf("%d spans of commit %s, want 1", len(sps), sfx)
		}
		published = append(published, sps[0])
	}
	for i, want := range []string{"corr-a", "corr-b"} {
		sp := published[i]
		if sp.SpanContext().TraceID() != tracing.SpanContext(want).TraceID() {
			t.Errorf("span %d: %s in trace %s, want relay.publish in %s's trace", i, sp.Name(), sp.SpanContext().TraceID(), want)
		}
	}
	if published[0].Status().Code != codes.Error || published[1].Status().Code == codes.Error {
		t.Errorf("statuses %v, %v; want the unacknowledged commit's span only marked as an error", published[0].Status(), published[1].Status())
	}
}
