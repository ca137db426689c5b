package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// startTracing installs an OpenTelemetry tracer provider exporting spans
// over OTLP/HTTP when an OTLP endpoint is configured, and returns its
// shutdown (which flushes). Without an endpoint tracing stays off: the
// packages' tracers are no-ops.
func startTracing(ctx context.Context, c Config) (shutdown func(context.Context) error, err error) {
	if c.Tracing.OTLPEndpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	// The exporter reads OTEL_EXPORTER_OTLP_* (endpoint, headers, TLS)
	// from the environment itself.
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "orderd"),
		attribute.String("service.instance.id", c.instanceID()), attribute.String("orderd.roles", c.Roles))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}
