package http_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	orderhttp "github.com/orderd/orderd/http"
)

// TestRequestLogCarriesCorrelationIDs: a command is logged as one JSON
// line with its route, status, request id and the client's correlation id;
// without X-Correlation-ID the request id stands in, as in the events.
func TestRequestLogCarriesCorrelationIDs(t *testing.T) {
	var buf bytes.Buffer
	e := newEnv(t, func(c *orderhttp.Config) {
		c.Log = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if rec := e.post(t, "/v1/orders", placeBody("logged-1"), "X-Correlation-ID", "corr-logged", "X-Request-Id", "req-1"); rec.Code != http.StatusCreated {
		t.Fatalf("place: %d %s", rec.Code, rec.Body)
	}
	if rec := e.post(t, "/v1/orders/logged-1/approve", "", "X-Request-Id", "req-2"); rec.Code != http.StatusOK {
		t.Fatalf("approve: %d %s", rec.Code, rec.Body)
	}
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2 (the commands): %s", len(lines), buf.String())
	}
	want := []map[string]any{
		{"msg": "request", "level": "DEBUG", "method": "POST", "route": "/v1/orders", "status": float64(201), "request_id": "req-1", "correlation_id": "corr-logged"},
		{"msg": "request", "method": "POST", "route": "/v1/orders/:id/approve", "status": float64(200), "request_id": "req-2", "correlation_id": "req-2"},
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, lines[i][k], v, lines[i])
			}
		}
	}
}

// TestRequestLogLevels: at the default level a healthy command writes no
// line (a busy service's log stays readable); a request slower than
// SlowRequest is a warning, whatever its method.
func TestRequestLogLevels(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slow  time.Duration
		lines int
	}{
		{"quick", time.Hour, 0},
		{"slow", time.Nanosecond, 2}, // every request is slower than 1ns
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			e := newEnv(t, func(c *orderhttp.Config) {
				c.Log = slog.New(slog.NewJSONHandler(&buf, nil)) // info and above
				c.SlowRequest = tc.slow
			})
			if rec := e.post(t, "/v1/orders", placeBody("levels-"+tc.name)); rec.Code != http.StatusCreated {
				t.Fatalf("place: %d %s", rec.Code, rec.Body)
			}
			e.get(t, "/v1/orders/levels-"+tc.name)
			var lines []map[string]any
			for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
				if len(l) == 0 {
					continue
				}
				var m map[string]any
				if err := json.Unmarshal(l, &m); err != nil {
					t.Fatalf("log line %q is not JSON: %v", l, err)
				}
				lines = append(lines, m)
			}
			if len(lines) != tc.lines {
				t.Fatalf("%d log lines, want %d: %s", len(lines), tc.lines, buf.String())
			}
			for _, l := range lines {
				if l["level"] != "WARN" || l["msg"] != "request" {
					t.Errorf("slow request logged as %v", l)
				}
			}
		})
	}
}
