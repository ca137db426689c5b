package main

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
)

// TestTracingFollowsACommandThroughThePipeline records the spans of one
// command: the HTTP request, the append, the relay's publish and both
// projections' apply all land in the trace derived from the command's
// correlation id, and the append is a child of the request's span.
func TestTracingFollowsACommandThroughThePipeline(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	m := runMain(t)
	c := newClient(t, m)
	const correlation = "trace-me-1"
	body := `{"order_id":"traced-1","customer_id":"cust-t","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":100}]}`
	c.must(http.StatusCreated, "POST", "/v1/orders", body, "X-Correlation-ID", correlation)
	c.must(http.StatusOK, "GET", "/v1/order-summaries/traced-1?min_version=1", "")

	want, _ := domain.TraceIDs(correlation)
	var names []string
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		names = names[:0]
		byName := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == trace.TraceID(want) {
				names = append(names, s.Name())
				byName[s.Name()] = s
			}
		}
		applies := 0
		for _, s := range rec.Ended() {
			if s.Name() == "projection.apply" && s.SpanContext().TraceID() == trace.TraceID(want) {
				applies++
			}
		}
		if byName["HTTP POST /v1/orders"] == nil || byName["eventstore.append"] == nil || byName["relay.publish"] == nil || applies < 2 {
			return false
		}
		if p := byName["eventstore.append"].Parent(); p.SpanID() != byName["HTTP POST /v1/orders"].SpanContext().SpanID() {
			t.Errorf("the append's parent is %s, want the request's span", p.SpanID())
		}
		return true
	}) {
		t.Fatalf("spans in the correlation's trace: %v; want the request, append, relay publish and two projection applies", names)
	}
	slices.Sort(names)
	t.Logf("spans of trace %s: %v", trace.TraceID(want), names)
	// A request that brings W3C trace context keeps the caller's trace.
	caller := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	c.must(http.StatusOK, "GET", "/v1/orders/traced-1", "", "traceparent", caller)
	found := false
	for _, s := range rec.Ended() {
		if s.Name() == "HTTP GET /v1/orders/:id" && fmt.Sprint(s.SpanContext().TraceID()) == "0af7651916cd43dd8448eb211c80319c" {
			found = true
		}
	}
	if !found {
		t.Error("a request with traceparent did not continue the caller's trace")
	}
}

// TestMain_EmbeddedSummary: on start the embedded mode says where its data
// lives, the API's URL, the embedded store's MongoDB URI and the NATS URL,
// and whether the admin API is on.
func TestMain_EmbeddedSummary(t *testing.T) {
	dir := t.TempDir()
	m := runMainEmbedded(t, dir)
	out := m.Out.(*bytes.Buffer).String()
	for _, want := range []string{dir, "http://" + m.HTTPAddr, m.Config.Mongo.URI, m.Config.NATS.URL, "admin API        off",
		filepath.Join(dir, "store"), filepath.Join(dir, "nats")} {
		if !strings.Contains(out, want) {
			t.Errorf("the start-up summary does not mention %q:\n%s", want, out)
		}
	}
}
