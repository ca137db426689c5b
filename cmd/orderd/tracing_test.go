package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
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
	"github.com/orderd/orderd/mongodb/storetest"
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
		if byName["HTTP POST /v1/orders"] == nil || byName["eventstore.append"] == nil || byName["relay.publish"] == nil || applies < 1 {
			return false
		}
		if p := byName["eventstore.append"].Parent(); p.SpanID() != byName["HTTP POST /v1/orders"].SpanContext().SpanID() {
			t.Errorf("the append's parent is %s, want the request's span", p.SpanID())
		}
		return true
	}) {
		t.Fatalf("spans in the correlation's trace: %v; want the request, append, relay publish and the projection apply", names)
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
// and, being on loopback without ADMIN_TOKEN, the console's link with the
// token it made and the export that lets the operator commands use it.
func TestMain_EmbeddedSummary(t *testing.T) {
	dir := t.TempDir()
	m := runMainEmbedded(t, dir)
	out := m.Out.(*bytes.Buffer).String()
	token := m.Config.HTTP.AdminToken
	if len(token) != 32 {
		t.Fatalf("admin token %q: want 32 hex characters made by the development mode", token)
	}
	for _, want := range []string{dir, "http://" + m.HTTPAddr, m.Config.Mongo.URI, m.Config.NATS.URL,
		"console          http://" + m.HTTPAddr + "/console/#token=" + token, "export ADMIN_TOKEN=" + token,
		filepath.Join(dir, "store"), filepath.Join(dir, "nats")} {
		if !strings.Contains(out, want) {
			t.Errorf("the start-up summary does not mention %q:\n%s", want, out)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "admin-token"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin-token file: %v, %v; want mode 0600", fi, err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+m.HTTPAddr+"/v1/admin/projections", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("admin API with the printed token: %d", resp.StatusCode)
	}
}

// TestMain_NoDevTokenOutside: with a store of its own (MONGODB_URI) the
// instance is not the development mode: without ADMIN_TOKEN it makes no
// token, says the admin API is off and answers its routes 404.
func TestMain_NoDevTokenOutside(t *testing.T) {
	dir := t.TempDir()
	p, err := storetest.StartStoreProcess(filepath.Join(dir, "store"), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() }) // after Main's close, registered later
	m := runMainDir(t, dir, func(c *Config) { c.Mongo.URI = p.URI })
	if m.Config.HTTP.AdminToken != "" {
		t.Errorf("admin token %q made outside the development mode", m.Config.HTTP.AdminToken)
	}
	out := m.Out.(*bytes.Buffer).String()
	if !strings.Contains(out, "admin API        off") || strings.Contains(out, "#token=") {
		t.Errorf("the start-up summary:\n%s\nwant the admin API off and no console link", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin-token")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("admin-token file: %v; want none", err)
	}
	resp, err := http.Get("http://" + m.HTTPAddr + "/v1/admin/projections")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("admin API without ADMIN_TOKEN: %d, want 404", resp.StatusCode)
	}
}

// TestDevMode: only everything embedded and the HTTP server on loopback,
// without ADMIN_TOKEN, makes a token of its own.
func TestDevMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want bool
	}{
		{"default", func(*Config) {}, true},
		{"localhost", func(c *Config) { c.HTTPAddr = "localhost:8080" }, true},
		{"ipv6 loopback", func(c *Config) { c.HTTPAddr = "[::1]:8080" }, true},
		{"every interface", func(c *Config) { c.HTTPAddr = ":8080" }, false},
		{"0.0.0.0", func(c *Config) { c.HTTPAddr = "0.0.0.0:8080" }, false},
		{"MONGODB_URI", func(c *Config) { c.Mongo.URI = "mongodb://127.0.0.1:27017/" }, false},
		{"NATS_URL", func(c *Config) { c.NATS.URL = "nats://127.0.0.1:4222" }, false},
		{"ADMIN_TOKEN", func(c *Config) { c.HTTP.AdminToken = "mine" }, false},
	} {
		c := DefaultConfig()
		tc.set(&c)
		if got := devMode(&c); got != tc.want {
			t.Errorf("%s: devMode = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestKeptAdminToken: the token made on first start is found again on
// the next, so the console's link and an exported ADMIN_TOKEN still work.
func TestKeptAdminToken(t *testing.T) {
	dir := t.TempDir()
	first, err := keptAdminToken(dir)
	if err != nil || len(first) != 32 {
		t.Fatalf("first start: %q, %v", first, err)
	}
	if again, err := keptAdminToken(dir); err != nil || again != first {
		t.Fatalf("restart: %q, %v; want %q", again, err, first)
	}
	if other, _ := keptAdminToken(t.TempDir()); other == first {
		t.Fatalf("another data dir has the same token %q", other)
	}
}
