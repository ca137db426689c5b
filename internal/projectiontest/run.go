package projectiontest

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// Context is the context of a test body: canceled when the test ends
// or after limit, whichever comes first.
func Context(t *testing.T, limit time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	return ctx
}

// Logger writes warnings and errors of the code under test to the
// test's output.
func Logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Go runs fn in a goroutine with its own context, canceled and waited
// for in cleanup. An error returned before cleanup fails the test at once,
// so polling loops (which check t.Failed) stop early.
func Go(t *testing.T, name string, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fn(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20s of cancellation", name)
		}
	})
}

// WaitFor polls cond every 20 ms until it returns nil, failing the test
// with cond's last error after limit.
func WaitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if t.Failed() {
			t.Fatalf("%s: gave up, the test already failed; last: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Must fails the test when a call returning (result, error) failed.
func Must(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}
