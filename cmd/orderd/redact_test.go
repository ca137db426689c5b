package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/internal/embedded"
)

// A store URI with a password: the password appears in no log line (at
// debug level, while the store is up and while it is down), in no
// /readyz answer and in no start-up output; the log shows the URI
// redacted. The embedded FerretDB takes any user and password over PLAIN.
func TestMain_SecretsRedacted(t *testing.T) {
	const password = "s3cret-pw-7f1e"
	store, err := embedded.StartStore(t.TempDir(), "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	storeUp := true
	t.Cleanup(func() {
		if storeUp {
			store.Close()
		}
	})
	host := strings.TrimSuffix(strings.TrimPrefix(store.URI, "mongodb://"), "/")

	logs := &syncBuffer{}
	m := NewMain()
	m.Config.HTTPAddr = "127.0.0.1:0"
	m.Config.Embedded.DataDir = t.TempDir()
	m.Config.Embedded.NATSAddr = "127.0.0.1:-1"
	m.Config.Mongo.URI = "mongodb://orderd:" + password + "@" + host + "/?authMechanism=PLAIN"
	m.Config.InstanceID = "redact-test"
	m.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	out := &syncBuffer{}
	m.Out = out
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatalf("Main.Run: %v", err)
	}
	defer m.Close()

	readyz := func() string {
		resp, err := http.Get("http://" + m.HTTPAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b)
	}
	answers := []string{readyz()}
	// A command and a failing readiness check log driver errors.
	c := &client{t: t, base: "http://" + m.HTTPAddr, http: &http.Client{Timeout: 30 * time.Second}}
	c.place("redact-1", "c-1", 1, 100, 0)
	store.Close()
	storeUp = false
	// The driver's heartbeats tell the store is down: wait for them.
	down := readyz()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(down, "503") && time.Now().Before(deadline); down = readyz() {
		time.Sleep(100 * time.Millisecond)
	}
	answers = append(answers, down)
	r := c.do("POST", "/v1/orders", `{"order_id":"redact-2","customer_id":"c-1","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":1}]}`)
	answers = append(answers, r.String())
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(answers[1], "503") {
		t.Errorf("with the store down: /readyz %s, command %s; want both 503", answers[1], r)
	}

	all := logs.String() + out.String() + strings.Join(answers, "\n")
	if strings.Contains(all, password) {
		t.Errorf("the password shows in the logs, output or answers:\n%s", all)
	}
	if want := "mongodb://orderd:xxxxx@" + host; !strings.Contains(logs.String(), want) {
		t.Errorf("the start-up log does not show the redacted URI %s:\n%s", want, logs.String())
	}
	if !strings.Contains(logs.String(), "readiness check failed") {
		t.Errorf("no failed readiness check was logged, so the test saw no driver error:\n%s", logs.String())
	}
}
