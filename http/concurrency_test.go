package http_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// parallel sends n copies of the request built by r at once and returns
// the answers.
func parallel(t *testing.T, e *env, n int, r func(i int) req) []*httptest.ResponseRecorder {
	t.Helper()
	out := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = e.do(t, r(i))
		})
	}
	close(start)
	wg.Wait()
	return out
}

func statusCount(recs []*httptest.ResponseRecorder) map[int]int {
	m := map[int]int{}
	for _, r := range recs {
		m[r.Code]++
	}
	return m
}

// TestConcurrentRetries: retries of one place racing each other, all with
// the key and no order id, make one order; every answer names it.
func TestConcurrentRetries(t *testing.T) {
	e := newEnv(t)
	recs := parallel(t, e, 8, func(int) req {
		return req{Method: http.MethodPost, Path: "/v1/orders", Body: placeBody(""), Header: map[string]string{"Idempotency-Key": "k-1"}}
	})
	ids := map[string]bool{}
	replayed := 0
	for _, rec := range recs {
		if rec.Code != http.StatusCreated {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		var a commandAnswer
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		ids[a.OrderID] = true
		if rec.Header().Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if len(ids) != 1 || replayed != 7 || e.store.Commits() != 1 {
		t.Errorf("%d order ids, %d replayed, %d commits; want 1, 7, 1", len(ids), replayed, e.store.Commits())
	}
}

// TestConcurrentCommands: of racing commands that exclude each other one
// wins; the others get the refusal a sequential client would get.
func TestConcurrentCommands(t *testing.T) {
	tests := []struct {
		name    string
		r       func(i int) req
		loser   int
		problem string
	}{
		{name: "approve", r: func(int) req { return req{Method: http.MethodPost, Path: "/v1/orders/o-1/approve"} },
			loser: http.StatusConflict, problem: "/problems/invalid-transition"},
		{name: "approve with If-Match", loser: http.StatusPreconditionFailed, problem: "/problems/precondition-failed",
			r: func(int) req {
				return req{Method: http.MethodPost, Path: "/v1/orders/o-1/approve", Header: map[string]string{"If-Match": `"1"`}}
			}},
		{name: "cancel or mark unavailable", loser: http.StatusConflict, problem: "/problems/invalid-transition",
			r: func(i int) req {
				cmd := []string{"cancel", "mark-unavailable"}[i%2]
				return req{Method: http.MethodPost, Path: "/v1/orders/o-1/" + cmd, Body: `{"reason": "r"}`}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.place(t, "o-1")
			recs := parallel(t, e, 6, tt.r)
			if c := statusCount(recs); c[http.StatusOK] != 1 || c[tt.loser] != 5 {
				t.Fatalf("answers %v, want one 200 and five %d", c, tt.loser)
			}
			for _, rec := range recs {
				if rec.Code != http.StatusOK {
					wantProblem(t, rec, tt.loser, tt.problem)
				}
			}
			if n := len(e.store.Events("o-1")); n != 2 {
				t.Errorf("stream holds %d events, want 2", n)
			}
		})
	}
}
