package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
	orderdhttp "github.com/orderd/orderd/http"
)

// api is the real REST API (package http) over domain.Service and an
// in-memory store; wrap, when set, wraps its handler.
func api(t *testing.T, store *domaintest.MemStore, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	var h http.Handler = orderdhttp.NewServer(orderdhttp.Config{Commands: domain.NewService(store, nil)}).Handler()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

// lossy runs every POST but loses the first answer to about one key in
// five: half of them by closing the connection, half by answering 502.
type lossy struct {
	next    http.Handler
	seen    sync.Map
	dropped atomic.Int64
}

func (l *lossy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	h := fnv.New32a()
	h.Write([]byte(key))
	sum := h.Sum32()
	if _, again := l.seen.LoadOrStore(key, true); r.Method != http.MethodPost || sum%5 != 0 || again {
		l.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	l.next.ServeHTTP(rec, r) // the command runs; its answer is lost
	l.dropped.Add(1)
	if sum%2 == 0 {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	http.Error(w, "lost", http.StatusBadGateway)
}

// checkLog checks rep.Acks against the store: per order, one event per
// ack, whose correlation id is the ack's key and whose version is the
// ack's, and no other event.
func checkLog(t *testing.T, store *domaintest.MemStore, rep Report) {
	t.Helper()
	byOrder := map[string]map[string]Ack{}
	for _, a := range rep.Acks {
		if byOrder[a.OrderID] == nil {
			byOrder[a.OrderID] = map[string]Ack{}
		}
		if _, dup := byOrder[a.OrderID][a.Key]; dup {
			t.Errorf("key %s acknowledged twice", a.Key)
		}
		byOrder[a.OrderID][a.Key] = a
	}
	if len(byOrder) != rep.Orders {
		t.Errorf("acks of %d orders, %d started", len(byOrder), rep.Orders)
	}
	for id, acks := range byOrder {
		events := store.Events(id)
		if len(events) != len(acks) {
			t.Errorf("order %s: %d events, %d acks %v", id, len(events), len(acks), acks)
		}
		for _, e := range events {
			if a, ok := acks[e.Metadata.CorrelationID]; !ok || e.Version != a.Version {
				t.Errorf("order %s: event v%d with correlation id %q: ack %+v", id, e.Version, e.Metadata.CorrelationID, a)
			}
		}
	}
}

func TestLoadgenLostAnswersAndRaces(t *testing.T) {
	store := domaintest.NewMemStore()
	l := &lossy{}
	lossyAPI := api(t, store, func(h http.Handler) http.Handler { l.next = h; return l })
	plainAPI := api(t, store, nil)
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{
		URLs: []string{lossyAPI.URL, plainAPI.URL + "/"}, Orders: 60, Concurrency: 6, ConflictRate: 0.4,
		Seed: 7, RunID: "t1", RetryFor: 10 * time.Second, Progress: &syncWriter{w: &progress},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = rep.Print(&out)
	t.Logf("answers lost: %d\n%s", l.dropped.Load(), out.String())
	if err := rep.Err(); err != nil {
		t.Fatalf("Err: %v\n%s", err, strings.Join(rep.Unexpected, "\n"))
	}
	switch {
	case rep.Orders != 60:
		t.Errorf("Orders %d, want 60", rep.Orders)
	case rep.Races == 0 || rep.RaceWins != rep.Races || rep.DoubleWins != 0:
		t.Errorf("races %d, won by one side %d, by both %d", rep.Races, rep.RaceWins, rep.DoubleWins)
	case rep.Retries == 0 || l.dropped.Load() == 0:
		t.Errorf("retries %d, answers lost %d: want some", rep.Retries, l.dropped.Load())
	case len(rep.Unknown) != 0:
		t.Errorf("unknown %v", rep.Unknown)
	case rep.Acked != len(rep.Acks) || rep.Commands != rep.Acked+rep.RefusedTotal():
		t.Errorf("commands %d, acked %d (%d acks), refused %v", rep.Commands, rep.Acked, len(rep.Acks), rep.Refused)
	}
	for k := range rep.Refused {
		if k != "precondition-failed" {
			t.Errorf("refused %s: only race losers should be refused, with 412: %v", k, rep.Refused)
		}
	}
	checkLog(t, store, rep)
	// Every order ended in a terminal status, and both kinds appear.
	ended := map[string]int{}
	last := map[string]Ack{}
	for _, a := range rep.Acks {
		last[a.OrderID] = a
	}
	for id, a := range last {
		if len(legal(domain.Status(a.Status))) != 0 {
			t.Errorf("order %s stopped in status %s", id, a.Status)
		}
		ended[a.Status]++
	}
	if ended["delivered"] == 0 || ended["canceled"] == 0 {
		t.Errorf("ended: %v, want delivered and canceled orders", ended)
	}
	if id := "t1-01"; last[id].OrderID != id {
		t.Errorf("order ids are not zero-padded: no %s in %v", id, rep.Acks[:3])
	}
}

// syncWriter is a bytes.Buffer safe for the progress goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestLoadgenDetectsDoubleWins runs against a service that drops If-Match:
// races then commit on both sides whenever the second command is still
// legal after the first.
func TestLoadgenDetectsDoubleWins(t *testing.T) {
	store := domaintest.NewMemStore()
	ts := api(t, store, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Del("If-Match")
			h.ServeHTTP(w, r)
		})
	})
	rep, err := Run(t.Context(), Config{URLs: []string{ts.URL}, Orders: 30, Concurrency: 4, ConflictRate: 1, RunID: "t2"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DoubleWins == 0 {
		t.Fatalf("no double win in %d races", rep.Races)
	}
	if err := rep.Err(); err == nil || !strings.Contains(err.Error(), "double wins") {
		t.Errorf("Err: %v, want double wins", err)
	}
	checkLog(t, store, rep) // the acks are still exactly the log
}

func TestLoadgenUnknownAfterRetryFor(t *testing.T) {
	var posts atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"type":"/problems/unavailable","status":503}`))
	}))
	defer ts.Close()
	rep, err := Run(t.Context(), Config{URLs: []string{ts.URL}, Orders: 3, RunID: "t3", RetryFor: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"t3-1-place", "t3-2-place", "t3-3-place"}
	slices.Sort(rep.Unknown)
	if !slices.Equal(rep.Unknown, want) || rep.Orders != 3 || rep.Acked != 0 || rep.Commands != 3 {
		t.Errorf("unknown %v, orders %d, acked %d, commands %d; want unknown %v", rep.Unknown, rep.Orders, rep.Acked, rep.Commands, want)
	}
	// Backoffs of 50, 100 and 200ms fit in 400ms, the next 400 does not:
	// 3 retries of each command when the answers are quick, at least 2.
	if rep.Retries < 6 || rep.Retries > 9 || posts.Load() != int64(rep.Retries+3) {
		t.Errorf("retries %d, POSTs %d; want 3 retries of each of 3 commands", rep.Retries, posts.Load())
	}
	if err := rep.Err(); err != nil {
		t.Errorf("Err: %v (unknown outcomes are no error)", err)
	}
}

func TestLoadgenStopsWhenCanceled(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body, so that a closed connection cancels r.Context();
		// then never answer.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer ts.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep, err := Run(ctx, Config{URLs: []string{ts.URL}, Orders: 100, Concurrency: 4, RunID: "t4", RetryFor: time.Minute, RequestTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Run took %v after the cancel", took)
	}
	if rep.Orders != 4 || len(rep.Unknown) != 4 {
		t.Errorf("orders %d, unknown %v; want the 4 in flight", rep.Orders, rep.Unknown)
	}
	// Canceled before anything ran: an error.
	if _, err := Run(ctx, Config{URLs: []string{ts.URL}, Orders: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run after the end of ctx: %v", err)
	}
}

func TestLoadgenDurationBound(t *testing.T) {
	store := domaintest.NewMemStore()
	ts := api(t, store, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(10 * time.Millisecond)
			h.ServeHTTP(w, r)
		})
	})
	rep, err := Run(t.Context(), Config{URLs: []string{ts.URL}, Orders: 100000, Duration: 300 * time.Millisecond, Concurrency: 2, RunID: "t5"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Orders < 2 || rep.Orders > 100 || rep.Elapsed > 5*time.Second {
		t.Errorf("orders %d in %v: want a few, within the duration and one order's time", rep.Orders, rep.Elapsed)
	}
	checkLog(t, store, rep)
}

func TestLoadgenLegalSteps(t *testing.T) {
	names := func(s domain.Status) string {
		var out []string
		for _, st := range legal(s) {
			to, _ := domain.Next(s, st.cmd)
			out = append(out, st.name()+">"+string(to))
		}
		return strings.Join(out, " ")
	}
	for s, want := range map[domain.Status]string{
		domain.StatusCreated:     "approve>approved cancel>canceled",
		domain.StatusApproved:    "invoice>invoiced process>processing ship>shipped cancel>canceled",
		domain.StatusInvoiced:    "process>processing ship>shipped cancel>canceled",
		domain.StatusProcessing:  "ship>shipped cancel>canceled",
		domain.StatusShipped:     "deliver>delivered cancel>canceled",
		domain.StatusDelivered:   "",
		domain.StatusCanceled:    "",
		domain.StatusUnavailable: "",
	} {
		if got := names(s); got != want {
			t.Errorf("legal in %s: %q, want %q", s, got, want)
		}
	}
}

func TestLoadgenConfig(t *testing.T) {
	ok := Config{URLs: []string{"http://127.0.0.1:8080"}, Orders: 1}
	with := func(f func(*Config)) Config { c := ok; c.URLs = slices.Clone(ok.URLs); f(&c); return c }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when valid
	}{
		{"ok", ok, ""},
		{"loopback v4", with(func(c *Config) { c.URLs = []string{"http://127.1.2.3:1/"} }), ""},
		{"loopback v6", with(func(c *Config) { c.URLs = []string{"http://[::1]:8080"} }), ""},
		{"localhost", with(func(c *Config) { c.URLs = []string{"https://LocalHost:8443", "http://localhost"} }), ""},
		{"long run id", with(func(c *Config) { c.RunID = strings.Repeat("r", 62) }), ""},
		{"no URLs", with(func(c *Config) { c.URLs = nil }), "no URLs"},
		{"private address", with(func(c *Config) { c.URLs = []string{"http://10.0.0.1:8080"} }), "loopback"},
		{"one of two remote", with(func(c *Config) { c.URLs = append(c.URLs, "http://example.com") }), "loopback"},
		{"0.0.0.0", with(func(c *Config) { c.URLs = []string{"http://0.0.0.0:8080"} }), "loopback"},
		{"localhost suffix", with(func(c *Config) { c.URLs = []string{"http://localhost.example.com"} }), "loopback"},
		{"scheme", with(func(c *Config) { c.URLs = []string{"ftp://127.0.0.1"} }), "want http"},
		{"no scheme", with(func(c *Config) { c.URLs = []string{"127.0.0.1:8080"} }), "URL"},
		{"no host", with(func(c *Config) { c.URLs = []string{"http:///v1"} }), "want http"},
		{"orders 0", with(func(c *Config) { c.Orders = 0 }), "orders"},
		{"conflicts over 1", with(func(c *Config) { c.ConflictRate = 1.5 }), "conflict rate"},
		{"conflicts negative", with(func(c *Config) { c.ConflictRate = -0.1 }), "conflict rate"},
		{"conflicts NaN", with(func(c *Config) { c.ConflictRate = math.NaN() }), "conflict rate"},
		{"concurrency", with(func(c *Config) { c.Concurrency = -1 }), "concurrency"},
		{"duration", with(func(c *Config) { c.Duration = -time.Second }), "duration"},
		{"run id chars", with(func(c *Config) { c.RunID = "a.b" }), "run id"},
		{"run id too long", with(func(c *Config) { c.RunID = strings.Repeat("r", 63) }), "run id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			err := cfg.check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("check: %v, want an error with %q", err, tc.want)
			case err == nil && (cfg.Concurrency != 8 || cfg.Customers != 20 || cfg.RetryFor != 30*time.Second ||
				cfg.RequestTimeout != 10*time.Second || cfg.RunID == "" || strings.HasSuffix(cfg.URLs[0], "/")):
				t.Errorf("defaults not filled in: %+v", cfg)
			}
		})
	}
	// Run refuses the same, before sending anything.
	if _, err := Run(t.Context(), Config{URLs: []string{"http://192.0.2.1"}, Orders: 1}); err == nil {
		t.Error("Run accepted a remote URL")
	}
}

func TestLoadgenDialsLoopbackOnly(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:80": true, "127.9.9.9:1": true, "[::1]:80": true,
		"10.0.0.1:80": false, "[2001:db8::1]:80": false, "0.0.0.0:80": false} {
		if err := loopbackOnly("tcp", addr, nil); (err == nil) != ok {
			t.Errorf("loopbackOnly(%s): %v", addr, err)
		}
	}
}

func TestLoadgenMain(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := Main(t.Context(), []string{"-h"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"Usage: orderd loadgen", "loopback", "-conflicts", "-acks"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, stderr.String())
		}
	}
	if err := Main(t.Context(), []string{"-conflicts", "2"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "conflict rate") {
		t.Errorf("-conflicts 2: %v", err)
	}

	store := domaintest.NewMemStore()
	ts := api(t, store, nil)
	acks := filepath.Join(t.TempDir(), "acks.jsonl")
	stdout.Reset()
	stderr.Reset()
	err := Main(t.Context(), []string{"-url", ts.URL + ", " + ts.URL, "-orders", "12", "-conflicts", "0.5", "-run-id", "tm", "-acks", acks}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("Main: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("\n%s", stdout.String())
	if !strings.Contains(stdout.String(), "run id       tm") || !strings.Contains(stdout.String(), "result       OK") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	f, err := os.Open(acks)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rep Report
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a Ack
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("acks line %q: %v", sc.Text(), err)
		}
		rep.Acks = append(rep.Acks, a)
	}
	rep.Orders = 12
	if len(rep.Acks) < 24 {
		t.Errorf("%d acks in the file", len(rep.Acks))
	}
	checkLog(t, store, rep)
}
