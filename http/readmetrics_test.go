package http_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/orderd/orderd/domain"
)

// TestReadMetrics: reads served over a real listener are timed by route
// template, and their errors counted by status class; the raw URL (an
// order id, a query) and requests to no route add no series.
func TestReadMetrics(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-read-1")
	e.reads.put(domain.Order{ID: "o-read-1", CustomerID: "c-1", Status: domain.StatusApproved, Version: 1})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.srv.Serve(ln) }()
	t.Cleanup(func() { _ = e.srv.Shutdown(t.Context()) })
	base := "http://" + ln.Addr().String()
	get := func(path string, want int) {
		t.Helper()
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		if res.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d", path, res.StatusCode, want)
		}
	}
	get("/v1/orders/o-read-1", http.StatusOK)
	get("/v1/orders/o-read-1/events", http.StatusOK)
	get("/v1/orders/no-such-order", http.StatusNotFound)
	get("/v1/order-summaries/o-read-1", http.StatusOK)
	get("/v1/order-summaries?customer_id=c-1", http.StatusOK)
	get("/v1/no-such-route/x", http.StatusNotFound)
	e.reads.mu.Lock()
	e.reads.err = errors.New("connection reset")
	e.reads.mu.Unlock()
	get("/v1/customers/c-1/order-stats", http.StatusInternalServerError)

	get("/metrics", http.StatusOK)
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	body := string(raw)
	for _, want := range []string{
		`orderd_read_request_duration_seconds_count{route="/v1/orders/:id"} 2`,
		`orderd_read_request_duration_seconds_count{route="/v1/orders/:id/events"} 1`,
		`orderd_read_request_duration_seconds_count{route="/v1/order-summaries/:id"} 1`,
		`orderd_read_request_duration_seconds_count{route="/v1/order-summaries"} 1`,
		`orderd_read_request_duration_seconds_count{route="/v1/customers/:id/order-stats"} 1`,
		`orderd_read_request_errors_total{class="4xx",route="/v1/orders/:id"} 1`,
		`orderd_read_request_errors_total{class="5xx",route="/v1/customers/:id/order-stats"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "orderd_read_request_") {
			continue
		}
		for _, bad := range []string{"o-read-1", "no-such", "customer_id=", "/metrics", "POST"} {
			if strings.Contains(line, bad) {
				t.Errorf("a read metric's labels hold %q: %s", bad, line)
			}
		}
	}
	if strings.Contains(body, `orderd_read_request_errors_total{class="4xx",route="/v1/order-summaries`) {
		t.Error("a read that succeeded is counted as an error")
	}
}
