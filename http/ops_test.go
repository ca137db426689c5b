package http_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	orderhttp "github.com/orderd/orderd/http"
)

// TestOpsOnly: an instance without the api role serves health, readiness
// and metrics, and no API route.
func TestOpsOnly(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) {
		c.OpsOnly = true
		c.Commands, c.ReadModels = nil, nil
		c.Ready = map[string]orderhttp.Check{"bus": func(context.Context) error { return domain.ErrUnavailable }}
	})
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/metrics": 200, "/openapi.json": 404,
		"/v1/orders/o-1": 404, "/v1/order-summaries/o-1": 404} {
		if rec := e.get(t, path); rec.Code != want {
			t.Errorf("GET %s: %d %s, want %d", path, rec.Code, rec.Body, want)
		}
	}
	if rec := e.post(t, "/v1/orders", placeBody("o-1")); rec.Code != http.StatusNotFound {
		t.Errorf("POST /v1/orders: %d, want 404", rec.Code)
	}
	if rec := e.get(t, "/readyz"); !strings.Contains(rec.Body.String(), `"bus":"unavailable"`) {
		t.Errorf("/readyz: %s, want the bus named", rec.Body)
	}
}

func TestHealthz(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) {
		c.Ready = map[string]orderhttp.Check{"store": func(context.Context) error { return errors.New("down") }}
	})
	rec := e.get(t, "/healthz")
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"status":"ok"}` {
		t.Errorf("GET /healthz: %d %s, want 200 even with a dependency down", rec.Code, rec.Body)
	}
}

func TestReadyz(t *testing.T) {
	ok := func(context.Context) error { return nil }
	down := func(context.Context) error { return domain.ErrUnavailable }
	tests := []struct {
		name   string
		checks map[string]orderhttp.Check
		status int
		want   map[string]string
	}{
		{name: "no checks", checks: nil, status: 200, want: map[string]string{}},
		{name: "all pass", checks: map[string]orderhttp.Check{"store": ok, "bus": ok}, status: 200,
			want: map[string]string{"store": "ok", "bus": "ok"}},
		{name: "bus down", checks: map[string]orderhttp.Check{"store": ok, "bus": down}, status: 503,
			want: map[string]string{"store": "ok", "bus": "unavailable"}},
		{name: "all down", checks: map[string]orderhttp.Check{"store": down, "bus": down}, status: 503,
			want: map[string]string{"store": "unavailable", "bus": "unavailable"}},
		{name: "check honours its deadline", status: 503, want: map[string]string{"store": "unavailable"},
			checks: map[string]orderhttp.Check{"store": func(ctx context.Context) error {
				if _, ok := ctx.Deadline(); !ok {
					return errors.New("no deadline")
				}
				<-ctx.Done()
				return ctx.Err()
			}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "check honours its deadline" && testing.Short() {
				t.Skip("waits for the 2s check timeout")
			}
			e := newEnv(t, func(c *orderhttp.Config) { c.Ready = tt.checks })
			rec := e.get(t, "/readyz")
			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			var got map[string]string
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %s: %v", rec.Body, err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("body %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("check %s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t)
	e.place(t, "o-1")
	e.post(t, "/v1/orders", placeBody("o-1")) // replayed
	e.post(t, "/v1/orders/o-1/deliver", "")   // invalid transition

	rec := e.get(t, "/metrics")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	body := rec.Body.String()
	for _, want := range []string{
		`orderd_commands_total{command="place",outcome="accepted"} 1`,
		`orderd_commands_total{command="place",outcome="replayed"} 1`,
		`orderd_commands_total{command="deliver",outcome="invalid-transition"} 1`,
		`orderd_command_duration_seconds_count{command="place"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
}

func TestUnknownRoute(t *testing.T) {
	e := newEnv(t)
	wantProblem(t, e.get(t, "/v2/orders"), http.StatusNotFound, "/problems/route")
	wantProblem(t, e.do(t, req{Method: http.MethodPost, Path: "/healthz"}), http.StatusMethodNotAllowed, "/problems/method")
	// Under /v1 a wrong method is a 404: echo's Group.Use registers a
	// catch-all route for the group, which matches before the router can
	// tell that the path exists with another method.
	for _, r := range []req{{Method: http.MethodDelete, Path: "/v1/orders/o-1"}, {Method: http.MethodGet, Path: "/v1/orders/o-1/approve"}} {
		rec := e.do(t, r)
		if rec.Code == http.StatusMethodNotAllowed {
			wantProblem(t, rec, http.StatusMethodNotAllowed, "/problems/method")
		} else {
			wantProblem(t, rec, http.StatusNotFound, "/problems/route")
		}
	}
}

// TestOverload: past MaxInFlight concurrent requests the server answers
// 503 at once instead of queueing, except to the probes and the scrape.
func TestOverload(t *testing.T) {
	e := newEnv(t, func(c *orderhttp.Config) { c.MaxInFlight = 1 })
	e.reads.put(summary("o-1", 1))
	e.reads.entered, e.reads.release = make(chan struct{}), make(chan struct{})
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- e.get(t, "/v1/order-summaries/o-1") }()
	<-e.reads.entered // the first request holds the only slot

	wantProblem(t, e.get(t, "/v1/orders/o-1"), http.StatusServiceUnavailable, "/problems/overloaded")
	// The probes and the scrape still answer: a busy instance is alive.
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if rec := e.get(t, path); rec.Code != http.StatusOK {
			t.Errorf("%s while overloaded: %d %s, want 200", path, rec.Code, rec.Body)
		}
	}

	close(e.reads.release)
	if rec := <-done; rec.Code != http.StatusOK {
		t.Errorf("the first request: %d %s", rec.Code, rec.Body)
	}
}

// TestSlowClientsAreCutOff serves over a real listener with short
// timeouts: a client that never finishes its headers, and one that never
// finishes its body, each have their connection closed by the server
// (within a bounded wait on the client side), and the slow body appends nothing;
// a well-behaved request on the same server still succeeds.
func TestSlowClientsAreCutOff(t *testing.T) {
	store := domaintest.NewMemStore()
	srv := orderhttp.NewServer(orderhttp.Config{
		Commands: domain.NewService(store, nil), ReadModels: newFakeReads(), Ready: map[string]orderhttp.Check{},
		ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, IdleTimeout: time.Second,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		<-served
	})

	// closedByServer sends start, then waits for the server
	// to end the connection (3s: well past the 200ms and 500ms configured,
	// short of the 5s and 30s defaults), and returns what it answered.
	closedByServer := func(start string) string {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, start); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("after %q the server kept the connection open for 3s", start)
		}
		return string(b)
	}
	closedByServer("POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nContent-Type: appli")
	body := `{"order_id":"slow-1","customer_id":"c-1","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":1}]}`
	answer := closedByServer("POST /v1/orders HTTP/1.1\r\nHost: orderd\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body[:20])
	if strings.HasPrefix(answer, "HTTP/1.1 2") || strings.HasPrefix(answer, "HTTP/1.1 5") {
		t.Errorf("a body cut short by the read timeout was answered %q", answer)
	}
	if n := store.Commits(); n != 0 {
		t.Errorf("the slow clients appended %d commits", n)
	}
	resp, err := http.Post("http://"+ln.Addr().String()+"/v1/orders", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("a prompt client after the slow ones: %d", resp.StatusCode)
	}
}

// TestWrongMethodIs405: a route that exists answers another method with
// 405, the methods it takes in Allow, and the method problem type, under
// /v1 as on the operational routes.
func TestWrongMethodIs405(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		r     req
		allow string
	}{
		{req{Method: http.MethodDelete, Path: "/v1/orders/o-1"}, "GET"},
		{req{Method: http.MethodGet, Path: "/v1/orders"}, "POST"},
		{req{Method: http.MethodPut, Path: "/v1/order-summaries/o-1"}, "GET"},
		{req{Method: http.MethodPut, Path: "/healthz"}, "GET"},
	} {
		rec := e.do(t, tc.r)
		wantProblem(t, rec, http.StatusMethodNotAllowed, "/problems/method")
		if allow := rec.Header().Get("Allow"); !strings.Contains(allow, tc.allow) {
			t.Errorf("%s %s: Allow %q, want it to name %s", tc.r.Method, tc.r.Path, allow, tc.allow)
		}
	}
}
