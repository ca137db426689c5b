package http_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
)

// stubCommands answers every call with err, or panics when err is nil.
type stubCommands struct{ err error }

var _ orderhttp.Commands = stubCommands{}

func (s stubCommands) Execute(context.Context, string, domain.Command, domain.ExecOptions) (domain.Result, error) {
	if s.err == nil {
		panic("boom")
	}
	return domain.Result{}, s.err
}

func (s stubCommands) Get(context.Context, string) (domain.Order, error) {
	return domain.Order{}, s.err
}

func (s stubCommands) EventsUntil(context.Context, string, domain.Bound) (domain.Order, []domain.Event, error) {
	return domain.Order{}, nil, s.err
}

// TestErrorTable: each domain error maps to its status and problem type;
// anything else is a 500 that tells nothing of the internals.
func TestErrorTable(t *testing.T) {
	const secret = "mongodb://admin:hunter2@10.0.0.7:27017"
	tests := []struct {
		name   string
		err    error
		status int
		typ    string
		bug    string
	}{
		{name: "version conflict", err: fmt.Errorf("approve o-1 after 6 attempts: %w", domain.ErrVersionConflict), status: 409, typ: "/problems/conflict"},
		{name: "not found", err: fmt.Errorf("order o-1: %w", domain.ErrNotFound), status: 404, typ: "/problems/not-found"},
		{name: "already exists", err: domain.ErrAlreadyExists, status: 409, typ: "/problems/already-exists"},
		{name: "validation", err: &domain.ValidationError{Fields: []domain.FieldError{{Field: "at", Detail: "x"}}}, status: 422, typ: "/problems/validation"},
		{name: "unknown error", err: errors.New("dial " + secret), status: 500, typ: "/problems/internal"},
		{name: "panic", err: nil, status: 500, typ: "/problems/internal"},
		{name: "unavailable", err: fmt.Errorf("append o-1: dial %s: %w", secret, domain.ErrUnavailable), status: 503, typ: "/problems/unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(c *orderhttp.Config) { c.Commands = stubCommands{tt.err} })
			rec := e.post(t, "/v1/orders/o-1/approve", "")
			p := wantProblem(t, rec, tt.status, tt.typ)
			if tt.bug != "" {
				knownBug(t, tt.bug)
			}
			if tt.status >= 500 && (strings.Contains(p.Detail, "10.0.0.7") || strings.Contains(rec.Body.String(), "hunter2")) {
				t.Errorf("a %d tells the client about the internals: %s", tt.status, rec.Body)
			}
		})
	}
}

// TestRequestIDHeader: the request id becomes the causation id of the
// events (and, without X-Correlation-ID, their correlation id). A client's
// X-Request-Id must not put unbounded data into the log: here 600 KiB make
// an event whose wire form is over the 1 MiB limit UnmarshalEvent accepts,
// a poison message for every consumer.
func TestRequestIDHeader(t *testing.T) {
	for _, rid := range []string{strings.Repeat("x", 600<<10), "a b", "\x80\xff", strings.Repeat("r", 129)} {
		e := newEnv(t)
		e.place(t, "o-1")
		rec := e.post(t, "/v1/orders/o-1/approve", "", "X-Request-Id", rid)
		if rec.Code/100 != 2 {
			readProblem(t, rec)
			continue // refused: fine
		}
		evs := e.store.Events("o-1")
		last := evs[len(evs)-1]
		for name, id := range map[string]string{"causation": last.Metadata.CausationID, "correlation": last.Metadata.CorrelationID} {
			if len(id) > 128 || strings.ContainsAny(id, " \x80\xff") {
				t.Errorf("X-Request-Id %.20q...: stored %s id of %d bytes %.20q", rid, name, len(id), id)
			}
		}
		b, err := domain.MarshalEvent(last)
		if err == nil {
			_, err = domain.UnmarshalEvent(b)
		}
		if err != nil {
			t.Errorf("X-Request-Id %.20q...: the stored event does not round-trip: %v", rid, err)
		}
	}
}
