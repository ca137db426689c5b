package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
)

// lossyProxy forwards every request to the service and relays its
// answer, except for a deterministic fifth of the POSTs (by hash of the
// Idempotency-Key and how many times the proxy has seen that key): those
// it forwards, waits for the service's answer, and then loses, half by
// closing the client's connection without a word and half by answering
// 502. The command committed; the client never heard.
type lossyProxy struct {
	target   string
	client   *http.Client
	mu       sync.Mutex
	seen     map[string]int
	dropped  atomic.Int64
	replayed atomic.Int64 // answers relayed with Idempotent-Replayed: true
	lost     sync.Map     // keys of lost answers
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if key := r.Header.Get("Idempotency-Key"); r.Method == http.MethodPost && key != "" {
		p.mu.Lock()
		p.seen[key]++
		h := fnv.New32a()
		fmt.Fprintf(h, "%s#%d", key, p.seen[key])
		p.mu.Unlock()
		if sum := h.Sum32(); sum%5 == 0 {
			p.dropped.Add(1)
			p.lost.Store(key, resp.StatusCode)
			if sum%2 == 0 {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					conn.Close()
					return
				}
			}
			http.Error(w, "answer lost by the test proxy", http.StatusBadGateway)
			return
		}
	}
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		p.replayed.Add(1)
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// TestLoadgenLostAnswersCommitOnce drives orders with races through the
// whole service, half of the commands through a proxy that loses a fifth
// of the answers after the service committed, and checks the event log:
// exactly one event per acknowledged command, so a lost answer plus a
// retry with the same Idempotency-Key commits once; and that the whole
// service, under that load, only ever inserted into the log (its store
// runs in this process, so that its writes are counted).
func TestLoadgenLostAnswersCommitOnce(t *testing.T) {
	m := runMainEmbedded(t, t.TempDir())
	c := newClient(t, m)
	p := &lossyProxy{target: "http://" + m.HTTPAddr, client: &http.Client{Timeout: 30 * time.Second}, seen: map[string]int{}}
	proxy := httptest.NewServer(p)
	defer proxy.Close()

	var progress syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := loadgen.Run(ctx, loadgen.Config{
		URLs:   []string{proxy.URL, "http://" + m.HTTPAddr},
		Orders: 40, Concurrency: 4, ConflictRate: 0.3, Seed: 1, RunID: "lglost",
		RetryFor: 20 * time.Second, Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = rep.Print(&out)
	lostKeys := 0
	p.lost.Range(func(k, _ any) bool { lostKeys++; return true })
	t.Logf("proxy lost %d answers (of %d keys), relayed %d replayed answers\n%s%s",
		p.dropped.Load(), lostKeys, p.replayed.Load(), out.String(), progress.String())

	if err := rep.Err(); err != nil {
		t.Errorf("Report.Err: %v\n%s", err, strings.Join(rep.Unexpected, "\n"))
	}
	if rep.Orders != 40 || rep.DoubleWins != 0 || rep.Races == 0 || rep.Retries == 0 || len(rep.Unknown) != 0 {
		t.Errorf("orders %d, double wins %d, races %d, retries %d, unknown %v: want 40, 0, >0, >0, none",
			rep.Orders, rep.DoubleWins, rep.Races, rep.Retries, rep.Unknown)
	}
	if p.dropped.Load() == 0 {
		t.Fatal("the proxy lost no answer")
	}

	// Per order: the acks, by idempotency key, and the last acked version.
	acks := map[string]map[string]loadgen.Ack{}
	last := map[string]int64{}
	for _, a := range rep.Acks {
		if acks[a.OrderID] == nil {
			acks[a.OrderID] = map[string]loadgen.Ack{}
		}
		if _, dup := acks[a.OrderID][a.Key]; dup {
			t.Errorf("%s acknowledged twice", a.Key)
		}
		acks[a.OrderID][a.Key] = a
		last[a.OrderID] = max(last[a.OrderID], a.Version)
	}
	if len(acks) != rep.Orders {
		t.Errorf("acks of %d orders, %d started", len(acks), rep.Orders)
	}
	// Each lost answer was retried (to the service or again through the
	// proxy) until acknowledged, or it was a race's loser, refused on its
	// retry as on its first try.
	lostAcked := 0
	p.lost.Range(func(k, _ any) bool {
		key := k.(string)
		id := key[:len("lglost-00")]
		switch _, ok := acks[id][key]; {
		case ok:
			lostAcked++
		case !strings.HasSuffix(key, "-a") && !strings.HasSuffix(key, "-b"):
			t.Errorf("lost answer of %s: not acknowledged after retries", key)
		}
		return true
	})
	t.Logf("%d lost answers were of commands that committed and were acknowledged on a retry", lostAcked)
	if lostAcked == 0 {
		t.Error("no lost answer of a command that committed: the check below proves nothing")
	}
	logged := 0 // events in the log
	for id, byKey := range acks {
		var body struct {
			Version int64 `json:"version"`
			Events  []struct {
				Type     string `json:"type"`
				Version  int64  `json:"version"`
				Metadata struct {
					CorrelationID string `json:"correlation_id"`
				} `json:"metadata"`
			} `json:"events"`
		}
		c.must(http.StatusOK, "GET", "/v1/orders/"+id+"/events", "").decode(t, &body)
		logged += len(body.Events)
		// place appends one OrderPlaced, each lifecycle command one event.
		if len(body.Events) != len(byKey) {
			t.Errorf("order %s: %d events for %d acknowledged commands %v", id, len(body.Events), len(byKey), byKey)
		}
		if n := len(body.Events); body.Version != last[id] || n == 0 || body.Events[n-1].Version != last[id] {
			t.Errorf("order %s: stream at version %d, last acknowledged version %d", id, body.Version, last[id])
		}
		seen := map[string]bool{}
		for _, e := range body.Events {
			key := e.Metadata.CorrelationID
			a, ok := byKey[key]
			switch {
			case !ok:
				t.Errorf("order %s: event %s v%d by %q, which was not acknowledged", id, e.Type, e.Version, key)
			case seen[key]:
				t.Errorf("order %s: command %s appended twice", id, key)
			case a.Version != e.Version:
				t.Errorf("order %s: event %s v%d, acknowledged as version %d", id, e.Type, e.Version, a.Version)
			}
			seen[key] = true
		}
	}

	// Once the relay has published every event of the log, nothing (a
	// command, the relay, a projection) has written a commit but its
	// insert: no marker, no rewrite, no delete.
	var published float64
	if !waitFor(time.Minute, 100*time.Millisecond, func() bool {
		published = metric(t, c, "orderd_relay_published_events_total")
		return published >= float64(logged)
	}) {
		t.Errorf("the relay published %.0f events within a minute of the load; the log holds %d", published, logged)
	}
	assertInsertOnly(t, m)
}

// TestLoadgenConfigAndHelp checks that Run refuses bad configs before
// sending anything and that -h is flag.ErrHelp with a usage text.
func TestLoadgenConfigAndHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  loadgen.Config
		want string
	}{
		{"non-loopback URL", loadgen.Config{URLs: []string{"http://127.0.0.1:1", "http://203.0.113.7:8080"}, Orders: 1}, "loopback"},
		{"host name", loadgen.Config{URLs: []string{"http://orders.example.com"}, Orders: 1}, "loopback"},
		{"orders 0", loadgen.Config{URLs: []string{"http://127.0.0.1:1"}}, "orders"},
		{"conflict rate over 1", loadgen.Config{URLs: []string{"http://127.0.0.1:1"}, Orders: 1, ConflictRate: 1.01}, "conflict rate"},
		{"conflict rate negative", loadgen.Config{URLs: []string{"http://127.0.0.1:1"}, Orders: 1, ConflictRate: -1}, "conflict rate"},
		{"conflict rate NaN", loadgen.Config{URLs: []string{"http://127.0.0.1:1"}, Orders: 1, ConflictRate: math.NaN()}, "conflict rate"},
		{"run id", loadgen.Config{URLs: []string{"http://127.0.0.1:1"}, Orders: 1, RunID: "a/b"}, "run id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := loadgen.Run(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error with %q", err, tc.want)
			}
			if rep.Commands != 0 {
				t.Errorf("%d commands sent", rep.Commands)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	err := loadgen.Main(context.Background(), []string{"-h"}, &stdout, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("loadgen -h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"Usage: orderd loadgen", "loopback", "-orders", "-duration", "-url", "for example"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, stderr.String())
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("-h wrote to stdout: %q", stdout.String())
	}
}
