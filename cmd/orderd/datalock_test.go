//go:build !noembed

package main

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain_DataDirLocked: a second server on a data dir in use, all its
// ports its own, refuses to start, naming the holder's pid and addresses
// and what to change; once the first has stopped, the dir is free again.
func TestMain_DataDirLocked(t *testing.T) {
	dir := t.TempDir()
	first := runMainDir(t, dir)

	second := testMain(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := second.Run(ctx)
	_ = second.Close()
	if err == nil {
		t.Fatal("a second server on the same data dir started")
	}
	for _, want := range []string{"pid " + strconv.Itoa(os.Getpid()), first.HTTPAddr, first.Config.NATS.URL, "ORDERD_DATA_DIR", "-data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	t.Logf("refused: %v", err)
	if second.HTTPAddr != "" {
		t.Errorf("the refused server serves HTTP on %s", second.HTTPAddr)
	}

	closeMain(t, first)
	runMainDir(t, dir) // fails the test if the dir is still held
}

// TestMain_DataDirLockedBeforePort: a second server with the same
// environment as the first, its data dir and its HTTP port too, is told
// that the dir is in use and by which server, not that the port is
// taken (which would send it to move the port); the first keeps serving.
func TestMain_DataDirLockedBeforePort(t *testing.T) {
	dir := t.TempDir()
	first := runMainDir(t, dir)

	second := testMain(t, dir)
	second.Config.HTTPAddr = first.HTTPAddr
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := second.Run(ctx)
	_ = second.Close()
	if err == nil {
		t.Fatal("a second server on the same data dir and port started")
	}
	for _, want := range []string{"data dir " + dir + " is in use", "pid " + strconv.Itoa(os.Getpid()), first.HTTPAddr} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "not free") || strings.Contains(err.Error(), "ORDERD_HTTP_ADDR") {
		t.Errorf("refusal %q is about the port", err)
	}
	res, err := http.Get("http://" + first.HTTPAddr + "/healthz")
	if err != nil {
		t.Fatalf("the first server after the refusal: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the first server's /healthz: %d", res.StatusCode)
	}
}
