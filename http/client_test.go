package http_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
)

// serve starts h on a loopback port for the test and returns a client of
// it with token.
func serve(t *testing.T, h http.Handler, token string) *orderhttp.Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: ts.URL + "/", Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantError checks that err is an *orderhttp.Error of status and slug
// that wraps sentinel (nil: none of the domain's errors).
func wantError(t *testing.T, err error, status int, slug string, sentinel error) *orderhttp.Error {
	t.Helper()
	var pe *orderhttp.Error
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v (%T), want an *orderhttp.Error", err, err)
	}
	if pe.Status != status || pe.Slug() != slug {
		t.Errorf("error %d %s, want %d %s: %v", pe.Status, pe.Slug(), status, slug, err)
	}
	for _, s := range []error{domain.ErrNotFound, domain.ErrValidation, domain.ErrInvalidTransition, domain.ErrPreconditionFailed,
		domain.ErrJobRunning, domain.ErrJobFinished, domain.ErrUnavailable} {
		if errors.Is(err, s) != (s == sentinel) {
			t.Errorf("errors.Is(%v, %v) = %v", err, s, !(s == sentinel))
		}
	}
	return pe
}

func TestClientCommands(t *testing.T) {
	e := newEnv(t)
	c := serve(t, e.h, "")
	ctx := t.Context()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	place := domain.PlaceOrder{CustomerID: "c-1", Currency: "BRL", FreightCents: 300, At: at,
		Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1250, FreightCents: 90}}}
	key := domain.ExecOptions{IdempotencyKey: "k-place", CorrelationID: "corr-1"}
	res, err := c.Execute(ctx, "o-1", place, key)
	if err != nil || res != (domain.Result{OrderID: "o-1", Version: 1, Status: domain.StatusCreated}) {
		t.Fatalf("place: %+v, %v", res, err)
	}
	if res, err = c.Execute(ctx, "o-1", place, key); err != nil || !res.Replayed || res.Version != 1 {
		t.Errorf("place again with its key: %+v, %v; want the first result, replayed", res, err)
	}
	events := e.store.Events("o-1")
	if len(events) != 1 || events[0].Metadata.CorrelationID != "corr-1" || !events[0].OccurredAt.Equal(at) {
		t.Errorf("events %+v", events)
	}

	_, err = c.Execute(ctx, "o-1", domain.Approve{}, domain.ExecOptions{IfMatch: &domain.IfMatch{Versions: []int64{0}}})
	wantError(t, err, http.StatusPreconditionFailed, "precondition-failed", domain.ErrPreconditionFailed)
	if res, err = c.Execute(ctx, "o-1", domain.Approve{At: at}, domain.ExecOptions{IfMatch: &domain.IfMatch{Versions: []int64{5, 1}}}); err != nil || res.Version != 2 || res.Status != domain.StatusApproved {
		t.Errorf("approve at v1: %+v, %v", res, err)
	}
	_, err = c.Execute(ctx, "o-2", domain.Approve{}, domain.ExecOptions{IfMatch: &domain.IfMatch{Any: true}})
	wantError(t, err, http.StatusPreconditionFailed, "precondition-failed", domain.ErrPreconditionFailed)
	_, err = c.Execute(ctx, "o-1", domain.Deliver{}, domain.ExecOptions{})
	wantError(t, err, http.StatusConflict, "invalid-transition", domain.ErrInvalidTransition)
	if res, err = c.Execute(ctx, "o-1", domain.Cancel{Reason: "changed my mind"}, domain.ExecOptions{}); err != nil || res.Status != domain.StatusCanceled {
		t.Errorf("cancel: %+v, %v", res, err)
	}

	_, err = c.Execute(ctx, "o-2", domain.PlaceOrder{CustomerID: "c-1", Currency: "brl"}, domain.ExecOptions{})
	pe := wantError(t, err, http.StatusUnprocessableEntity, "validation", domain.ErrValidation)
	if !hasField(pe.Problem, "currency") || !hasField(pe.Problem, "items") {
		t.Errorf("validation problem %+v: want errors for currency and items", pe.Problem)
	}
	if !strings.Contains(err.Error(), "POST /v1/orders: 422 validation: ") {
		t.Errorf("error text %q", err)
	}

	o, err := c.Order(ctx, "o-1")
	if err != nil || o.ID != "o-1" || o.Version != 3 || o.Status != domain.StatusCanceled || o.TotalCents != 2*1250+90+300 {
		t.Errorf("order: %+v, %v", o, err)
	}
	_, err = c.Order(ctx, "nope")
	wantError(t, err, http.StatusNotFound, "not-found", domain.ErrNotFound)
}

func TestClientSummary(t *testing.T) {
	e := newEnv(t)
	c := serve(t, e.h, "")
	ctx := t.Context()
	e.reads.put(domain.Order{ID: "o-1", Version: 2, Status: domain.StatusApproved})
	o, stale, err := c.Summary(ctx, "o-1", orderhttp.SummaryQuery{})
	if err != nil || stale || o.Version != 2 {
		t.Errorf("summary: %+v, stale %v, %v", o, stale, err)
	}
	o, stale, err = c.Summary(ctx, "o-1", orderhttp.SummaryQuery{MinVersion: 3, Wait: 20 * time.Millisecond})
	if err != nil || !stale || o.Version != 2 {
		t.Errorf("summary at v3 after a short wait: %+v, stale %v, %v; want v2, stale", o, stale, err)
	}
	e.reads.putAfter(30*time.Millisecond, domain.Order{ID: "o-1", Version: 3, Status: domain.StatusInvoiced})
	if o, stale, err = c.Summary(ctx, "o-1", orderhttp.SummaryQuery{MinVersion: 3, Wait: 5 * time.Second}); err != nil || stale || o.Version != 3 {
		t.Errorf("summary at v3: %+v, stale %v, %v", o, stale, err)
	}
	_, _, err = c.Summary(ctx, "o-9", orderhttp.SummaryQuery{})
	wantError(t, err, http.StatusNotFound, "not-found", domain.ErrNotFound)
	_, _, err = c.Summary(ctx, "o-1", orderhttp.SummaryQuery{Wait: time.Hour})
	pe := wantError(t, err, http.StatusUnprocessableEntity, "validation", domain.ErrValidation)
	if pe.Method != http.MethodGet || pe.Path != "/v1/order-summaries/o-1?wait=1h0m0s" {
		t.Errorf("error of %s %s, want GET /v1/order-summaries/o-1?wait=1h0m0s", pe.Method, pe.Path)
	}
}

func TestClientAdmin(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	c := serve(t, e.h, adminToken)
	ctx := t.Context()
	rep, err := c.Projections(ctx)
	if list := rep.Projections; err != nil || len(list) != 2 || list[0].Name != "order_summaries" {
		t.Fatalf("projections: %+v, %v", rep, err)
	}
	job, err := c.StartRebuild(ctx, "order_summaries", 4)
	if err != nil || job.Kind != jobs.KindRebuild || job.Partitions != 4 {
		t.Fatalf("start rebuild: %+v, %v", job, err)
	}
	if def, err := c.StartRebuild(ctx, "customer_order_stats", 0); err != nil || def.Partitions != 1 {
		t.Errorf("start rebuild with the server's partitions: %+v, %v", def, err)
	}
	_, err = c.StartRebuild(ctx, "order_summaries", 0)
	wantError(t, err, http.StatusConflict, "job-running", domain.ErrJobRunning)
	_, err = c.StartRebuild(ctx, "nope", 0)
	wantError(t, err, http.StatusNotFound, "not-found", domain.ErrNotFound)
	_, err = c.StartRebuild(ctx, "order_summaries", jobs.MaxPartitions+1)
	wantError(t, err, http.StatusUnprocessableEntity, "validation", domain.ErrValidation)

	if got, err := c.Job(ctx, jobs.KindRebuild, "order_summaries", job.ID); err != nil || got.ID != job.ID {
		t.Errorf("job: %+v, %v", got, err)
	}
	_, err = c.Job(ctx, jobs.KindVerify, "order_summaries", job.ID)
	wantError(t, err, http.StatusNotFound, "not-found", domain.ErrNotFound)
	if _, err := c.Job(ctx, jobs.KindReplay, "order_summaries", job.ID); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("job of a kind the client does not read: %v, want ErrValidation", err)
	}
	if got, err := c.CancelRebuild(ctx, "order_summaries", job.ID); err != nil || !got.CancelRequested {
		t.Errorf("cancel: %+v, %v", got, err)
	}
	e.admin.finish(job.ID, jobs.StateCanceled, nil)
	_, err = c.CancelRebuild(ctx, "order_summaries", job.ID)
	wantError(t, err, http.StatusConflict, "job-finished", domain.ErrJobFinished)

	v, err := c.StartVerify(ctx, "customer_order_stats", true)
	if err != nil || v.Kind != jobs.KindVerify || !v.Repair {
		t.Errorf("start verify: %+v, %v", v, err)
	}
	if got, err := c.Job(ctx, jobs.KindVerify, "customer_order_stats", v.ID); err != nil || got.ID != v.ID {
		t.Errorf("verify job: %+v, %v", got, err)
	}
	if u, want := c.JobURL(jobs.KindVerify, "customer_order_stats", v.ID), "/v1/admin/projections/customer_order_stats/verifications/"+v.ID; !strings.HasSuffix(u, want) || !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Errorf("JobURL = %q, want the server's URL with %s", u, want)
	}
	if u := c.DeadLettersURL("a b"); !strings.HasSuffix(u, "/v1/admin/dead-letters?projection=a+b") {
		t.Errorf("DeadLettersURL = %q", u)
	}
}

func TestClientAdminRefused(t *testing.T) {
	e := newAdminEnv(t, adminToken)
	_, err := serve(t, e.h, "wrong").Projections(t.Context())
	wantError(t, err, http.StatusUnauthorized, "unauthorized", nil)
	_, err = serve(t, e.h, "").Projections(t.Context())
	wantError(t, err, http.StatusUnauthorized, "unauthorized", nil)
	off := newAdminEnv(t, "")
	_, err = serve(t, off.h, adminToken).Projections(t.Context())
	wantError(t, err, http.StatusNotFound, "route", nil)
	wantNoCalls(t, off.admin)
}

// TestClientAnswers checks the answers that are not the API's: a body
// that is no problem document, a 2xx that does not decode, a cut answer,
// and no answer.
func TestClientAnswers(t *testing.T) {
	long := strings.Repeat("x", 300)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/orders/gateway", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "  bad gateway "+long, http.StatusBadGateway)
	})
	mux.HandleFunc("GET /v1/orders/html", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html>not json</html>"))
	})
	mux.HandleFunc("GET /v1/orders/cut", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = w.Write([]byte(`{"id":`))
	})
	c := serve(t, mux, "")
	ctx := t.Context()
	_, err := c.Order(ctx, "gateway")
	pe := wantError(t, err, http.StatusBadGateway, "http-502", nil)
	if pe.Type != "" || !strings.HasPrefix(pe.Detail, "bad gateway xxx") || len(pe.Detail) != 203 || !strings.HasSuffix(pe.Detail, "...") {
		t.Errorf("problem %+v: want no type and the start of the body", pe.Problem)
	}
	if _, err = c.Order(ctx, "html"); !errors.Is(err, orderhttp.ErrUndecodable) || !strings.Contains(err.Error(), "<html>not json</html>") {
		t.Errorf("undecodable 200: %v", err)
	}
	var pe2 *orderhttp.Error
	if _, err = c.Order(ctx, "cut"); err == nil || errors.As(err, &pe2) || errors.Is(err, orderhttp.ErrUndecodable) {
		t.Errorf("cut answer: %v, want a read error", err)
	}
	ts := httptest.NewServer(mux)
	ts.Close()
	gone, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err = gone.Order(ctx, "o-1"); err == nil || errors.As(err, &pe2) {
		t.Errorf("no server: %v, want a transport error", err)
	}
}

func TestNewClientRefusesURL(t *testing.T) {
	for _, u := range []string{"", "ftp://127.0.0.1", "http:///v1", "127.0.0.1:8080", "http://[::1"} {
		if _, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: u}); err == nil || !strings.Contains(err.Error(), "want http://host:port") {
			t.Errorf("NewClient(%q): %v", u, err)
		}
	}
}
