package http_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// fakeGuard is a store that can be switched down, as mongodb.Reachability
// sees it.
type fakeGuard struct {
	mu      sync.Mutex
	down    bool
	cancels []context.CancelCauseFunc
}

func (g *fakeGuard) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		return ctx, func() {}, fmt.Errorf("store down: %w", domain.ErrUnavailable)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	g.cancels = append(g.cancels, cancel)
	return ctx, func() { cancel(context.Canceled) }, nil
}

func (g *fakeGuard) goDown() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for _, c := range g.cancels {
		c(fmt.Errorf("store went down: %w", domain.ErrUnavailable))
	}
}

// waitingCommands blocks Get until the request's context ends, as a read
// waiting in the driver's server selection does.
type waitingCommands struct {
	orderhttp.Commands
	waiting chan struct{}
}

func (w waitingCommands) Get(ctx context.Context, id string) (domain.Order, error) {
	close(w.waiting)
	<-ctx.Done()
	return domain.Order{}, fmt.Errorf("load %s: %w", id, ctx.Err())
}

// TestStoreDownAnswers503AtOnce: while the store is known to be down, /v1
// requests are answered 503 without reaching it (nothing is appended);
// health, readiness and metrics still answer; a request in flight when the
// store goes down is answered 503, not 500.
func TestStoreDownAnswers503AtOnce(t *testing.T) {
	g := &fakeGuard{}
	e := newEnv(t, func(c *orderhttp.Config) { c.Store = g })
	e.place(t, "o-1")
	g.goDown()
	rec := e.post(t, "/v1/orders", `{"order_id":"o-2","customer_id":"c-1","currency":"BRL","items":[{"sku":"s","quantity":1,"unit_price_cents":100}]}`)
	wantProblem(t, rec, http.StatusServiceUnavailable, "/problems/unavailable")
	if evs, _ := e.store.Load(t.Context(), "o-2", 0); len(evs) != 0 {
		t.Errorf("a refused command appended %d events", len(evs))
	}
	wantProblem(t, e.get(t, "/v1/orders/o-1"), http.StatusServiceUnavailable, "/problems/unavailable")
	if rec := e.get(t, "/healthz"); rec.Code != http.StatusOK {
		t.Errorf("/healthz while the store is down: %d", rec.Code)
	}

	g = &fakeGuard{}
	waiting := make(chan struct{})
	e = newEnv(t, func(c *orderhttp.Config) {
		c.Store = g
		c.Commands = waitingCommands{Commands: c.Commands, waiting: waiting}
	})
	go func() {
		<-waiting
		g.goDown()
	}()
	wantProblem(t, e.get(t, "/v1/orders/o-1"), http.StatusServiceUnavailable, "/problems/unavailable")
}
