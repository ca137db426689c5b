package domain_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
)

// storeNow is the store's clock: every append is recorded at it.
var storeNow = time.Date(2024, 6, 1, 12, 0, 0, 987_654_321, time.UTC)

// newMemStore returns an in-memory store recording every append at
// storeNow.
func newMemStore() *domaintest.MemStore {
	s := domaintest.NewMemStore()
	s.Now = func() time.Time { return storeNow }
	return s
}

var serviceNow = time.Date(2024, 6, 1, 11, 0, 0, 555_666_777, time.UTC)

// newService returns a Service on store with a fresh cache (none when
// cached is false), a fixed clock and sequential ids.
func newService(store domain.EventStore, cached bool) *domain.Service {
	var cache domain.StateCache
	if cached {
		cache, _ = lru.New[string, domain.Order](1024)
	}
	svc := domain.NewService(store, cache)
	svc.BaseBackoff = 50 * time.Microsecond
	svc.Now = func() time.Time { return serviceNow }
	svc.NewID = func() string { return fmt.Sprintf("id-%d", idSeq.Add(1)) }
	return svc
}

// idSeq numbers the ids of every test Service, so no two collide.
var idSeq atomic.Int64

var ctx = context.Background()

// placedOrder places orderID through svc, then runs cmds on it.
func placedOrder(t *testing.T, svc *domain.Service, cmds ...domain.Command) {
	t.Helper()
	for _, c := range append([]domain.Command{placeCmd()}, cmds...) {
		if _, err := svc.Execute(ctx, orderID, c, domain.ExecOptions{}); err != nil {
			t.Fatalf("%s: %v", domain.CommandName(c), err)
		}
	}
}

// expect checks Execute's result and error; want is compared without
// Attempts unless want.Attempts is set.
func expect(t *testing.T, got domain.Result, err error, want domain.Result, wantErr error) {
	t.Helper()
	if wantErr != nil {
		if !errors.Is(err, wantErr) {
			t.Fatalf("Execute error = %v, want %v", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if want.Attempts == 0 {
		got.Attempts = 0
	}
	if got != want {
		t.Fatalf("Execute = %+v, want %+v", got, want)
	}
}

func TestServicePlaceThenApprove(t *testing.T) {
	for _, cached := range []bool{true, false} {
		t.Run(fmt.Sprintf("cache=%v", cached), func(t *testing.T) {
			store := newMemStore()
			svc := newService(store, cached)
			r, err := svc.Execute(ctx, orderID, placeCmd(), domain.ExecOptions{})
			expect(t, r, err, domain.Result{OrderID: orderID, Version: 1, Status: domain.StatusCreated, Attempts: 1}, nil)
			r, err = svc.Execute(ctx, orderID, domain.Approve{At: at(1)}, domain.ExecOptions{})
			expect(t, r, err, domain.Result{OrderID: orderID, Version: 2, Status: domain.StatusApproved, Attempts: 1}, nil)

			o, evs, err := svc.EventsUntil(ctx, orderID, domain.Bound{})
			if err != nil || o.Status != domain.StatusApproved || o.Version != 2 || len(evs) != 2 {
				t.Fatalf("Get = %+v, %d events, %v", o, len(evs), err)
			}
			if !evs[0].OccurredAt.Equal(domain.Timestamp(serviceNow)) || !evs[1].OccurredAt.Equal(at(1)) {
				t.Fatalf("occurred at %v, %v", evs[0].OccurredAt, evs[1].OccurredAt)
			}
			if !reflect.DeepEqual(evs[0].Data, placed()) || evs[1].Data != (domain.OrderApproved{}) {
				t.Fatalf("payloads %#v, %#v", evs[0].Data, evs[1].Data)
			}
		})
	}
}

func TestServiceGet(t *testing.T) {
	svc := newService(newMemStore(), true)
	if _, _, err := svc.EventsUntil(ctx, "nope", domain.Bound{}); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
	if _, _, err := svc.EventsUntil(ctx, "a.b", domain.Bound{}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("Get(a.b) = %v, want ErrValidation", err)
	}
}

func TestServiceGeneratesOrderID(t *testing.T) {
	store := newMemStore()
	svc := newService(store, true)
	r1, err1 := svc.Execute(ctx, "", placeCmd(), domain.ExecOptions{})
	r2, err2 := svc.Execute(ctx, "", placeCmd(), domain.ExecOptions{})
	if err1 != nil || err2 != nil || r1.OrderID == r2.OrderID || domain.ValidateID("", r1.OrderID) != nil || r1.Version != 1 {
		t.Fatalf("Execute = %+v, %v; %+v, %v", r1, err1, r2, err2)
	}
	if evs := store.Events(r1.OrderID); len(evs) != 1 || evs[0].StreamID != r1.OrderID {
		t.Fatalf("stream %s = %+v", r1.OrderID, evs)
	}
	if _, err := svc.Execute(ctx, "", domain.Approve{}, domain.ExecOptions{}); !errors.Is(err, domain.ErrValidation) {
		t.Fatalf("approve with no order id = %v, want ErrValidation", err)
	}
}

func TestServiceRePlace(t *testing.T) {
	other := placeCmd()
	other.FreightCents++
	for _, tc := range []struct {
		name   string
		cached bool // the replacing service has the order cached
		cmd    domain.PlaceOrder
		want   domain.Result
		err    error
	}{
		{"identical, cached", true, placeCmd(), domain.Result{OrderID: orderID, Version: 1, Status: domain.StatusCreated, Replayed: true}, nil},
		{"identical, not cached", false, placeCmd(), domain.Result{OrderID: orderID, Version: 1, Status: domain.StatusCreated, Replayed: true}, nil},
		{"other content, cached", true, other, domain.Result{}, domain.ErrAlreadyExists},
		{"other content, not cached", false, other, domain.Result{}, domain.ErrAlreadyExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemStore()
			svc := newService(store, true)
			placedOrder(t, svc)
			if !tc.cached {
				svc = newService(store, true)
			}
			r, err := svc.Execute(ctx, orderID, tc.cmd, domain.ExecOptions{})
			expect(t, r, err, tc.want, tc.err)
			if n := len(store.Events(orderID)); n != 1 {
				t.Fatalf("stream has %d events, want 1", n)
			}
		})
	}
}

func TestServiceIdempotencyKey(t *testing.T) {
	store := newMemStore()
	svc := newService(store, true)
	placedOrder(t, svc)
	key := domain.ExecOptions{IdempotencyKey: "k-1"}
	first, err := svc.Execute(ctx, orderID, domain.Approve{}, key)
	expect(t, first, err, domain.Result{OrderID: orderID, Version: 2, Status: domain.StatusApproved}, nil)
	stored := store.Commits()

	for _, tc := range []struct {
		name    string
		svc     *domain.Service
		orderID string
		cmd     domain.Command
		err     error
	}{
		{"retry", svc, orderID, domain.Approve{}, nil},
		{"retry on another instance", newService(store, true), orderID, domain.Approve{}, nil},
		{"other command", svc, orderID, domain.Invoice{}, domain.ErrIdempotencyKeyReused},
		{"same command, other time", svc, orderID, domain.Approve{At: at(3)}, domain.ErrIdempotencyKeyReused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.svc.Execute(ctx, tc.orderID, tc.cmd, key)
			expect(t, r, err, domain.Result{OrderID: orderID, Version: 2, Status: domain.StatusApproved, Replayed: true}, tc.err)
			if n := store.Commits(); n != stored {
				t.Fatalf("%d commits stored after the first request, want 0", n-stored)
			}
		})
	}
	if n := len(store.Events(orderID)); n != 2 {
		t.Fatalf("stream has %d events, want 2", n)
	}
	// After the order moved on, a retry still answers with the first
	// result: its version and its status.
	if _, err := svc.Execute(ctx, orderID, domain.Invoice{}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := svc.Execute(ctx, orderID, domain.Approve{}, key)
	expect(t, r, err, domain.Result{OrderID: orderID, Version: 2, Status: domain.StatusApproved, Replayed: true}, nil)

	// A key belongs to the order it was used on: on another order the
	// same key is another request, decided and stored there.
	if _, err := svc.Execute(ctx, "o-2", placeCmd(), domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err = svc.Execute(ctx, "o-2", domain.Approve{}, key)
	expect(t, r, err, domain.Result{OrderID: "o-2", Version: 2, Status: domain.StatusApproved}, nil)
}

func TestServiceIdempotentPlaceWithGeneratedID(t *testing.T) {
	store := newMemStore()
	key := domain.ExecOptions{IdempotencyKey: "k-place"}
	first, err := newService(store, true).Execute(ctx, "", placeCmd(), key)
	if err != nil {
		t.Fatal(err)
	}
	// The id comes from the key, so a retry on any instance lands on the
	// same stream and collides there.
	if want := domain.KeyedOrderID("k-place"); first.OrderID != want {
		t.Fatalf("order id %q, want KeyedOrderID(key) %q", first.OrderID, want)
	}
	// A second instance generates another id, yet must answer with the first.
	r, err := newService(store, true).Execute(ctx, "", placeCmd(), key)
	expect(t, r, err, domain.Result{OrderID: first.OrderID, Version: 1, Status: domain.StatusCreated, Replayed: true}, nil)
	if store.Streams() != 1 {
		t.Fatalf("%d streams, want 1", store.Streams())
	}
	other := placeCmd()
	other.Currency = "USD"
	_, err = newService(store, true).Execute(ctx, "", other, key)
	expect(t, domain.Result{}, err, domain.Result{}, domain.ErrIdempotencyKeyReused)
	if store.Streams() != 1 || store.Commits() != 1 {
		t.Fatalf("%d streams, %d commits after the refused request, want 1 and 1", store.Streams(), store.Commits())
	}

	// Without a key every request is a new order: a retry after a lost
	// answer places another one.
	a, errA := newService(store, true).Execute(ctx, "", placeCmd(), domain.ExecOptions{})
	b, errB := newService(store, true).Execute(ctx, "", placeCmd(), domain.ExecOptions{})
	if errA != nil || errB != nil || a.OrderID == b.OrderID || a.Replayed || b.Replayed {
		t.Fatalf("two places without key: %+v %v, %+v %v; want two new orders", a, errA, b, errB)
	}
}

// KeyedOrderID is the standard name-based UUID (version 5) of the key in
// OrderIDNamespace, so any client or tool can compute it with a UUID
// library.
func TestKeyedOrderID(t *testing.T) {
	ns := uuid.MustParse(domain.OrderIDNamespace)
	for _, key := range []string{"k-place", "demo-place-1", "!", strings.Repeat("~", 128)} {
		got := domain.KeyedOrderID(key)
		if want := uuid.NewSHA1(ns, []byte(key)).String(); got != want {
			t.Errorf("KeyedOrderID(%q) = %s, want %s", key, got, want)
		}
		if err := domain.ValidateID("order id", got); err != nil {
			t.Errorf("KeyedOrderID(%q): %v", key, err)
		}
	}
	if domain.KeyedOrderID("a") == domain.KeyedOrderID("b") {
		t.Error("two keys, one id")
	}
}

// countingStore counts idempotency key look-ups.
type countingStore struct {
	*domaintest.MemStore
	lookups atomic.Int64
}

func (s *countingStore) FindIdempotencyKey(ctx context.Context, key, stream string) (domain.Commit, error) {
	s.lookups.Add(1)
	return s.MemStore.FindIdempotencyKey(ctx, key, stream)
}

// A first try with a key reads no key; a retry reads it once, after the
// unique index refused its append.
func TestServiceKeyLookups(t *testing.T) {
	store := &countingStore{MemStore: newMemStore()}
	key := domain.ExecOptions{IdempotencyKey: "k-1"}
	if _, err := newService(store, true).Execute(ctx, orderID, placeCmd(), key); err != nil {
		t.Fatal(err)
	}
	if n := store.lookups.Load(); n != 0 {
		t.Fatalf("first try: %d key look-ups, want 0", n)
	}
	r, err := newService(store, true).Execute(ctx, orderID, placeCmd(), key)
	expect(t, r, err, domain.Result{OrderID: orderID, Version: 1, Status: domain.StatusCreated, Replayed: true}, nil)
	if store.lookups.Load() != 1 || len(store.Events(orderID)) != 1 {
		t.Fatalf("retry: %d key look-ups, %d events; want 1 and 1", store.lookups.Load(), len(store.Events(orderID)))
	}
}

func TestServiceIfMatch(t *testing.T) {
	v := func(n ...int64) *domain.IfMatch { return &domain.IfMatch{Versions: n} }
	for _, tc := range []struct {
		name    string
		svc     func(*testing.T, *domaintest.MemStore) *domain.Service
		ifMatch *domain.IfMatch
		err     error
	}{
		{"stale, cache current", warm, v(1), domain.ErrPreconditionFailed},
		{"stale, no cache entry", cold, v(1), domain.ErrPreconditionFailed},
		{"stale, cache equally stale", stale, v(1), domain.ErrPreconditionFailed},
		{"ahead", warm, v(3), domain.ErrPreconditionFailed},
		{"none of a list", warm, v(1, 3), domain.ErrPreconditionFailed},
		{"an empty list", warm, v(), domain.ErrPreconditionFailed},
		{"current, cache current", warm, v(2), nil},
		{"current, no cache entry", cold, v(2), nil},
		{"current, cache stale", stale, v(2), nil},
		{"current in a list", cold, v(1, 2), nil},
		{"any, cache current", warm, &domain.IfMatch{Any: true}, nil},
		{"any, cache stale", stale, &domain.IfMatch{Any: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemStore()
			svc := tc.svc(t, store)
			appends := store.Appends.Load()
			r, err := svc.Execute(ctx, orderID, domain.Cancel{}, domain.ExecOptions{IfMatch: tc.ifMatch})
			expect(t, r, err, domain.Result{OrderID: orderID, Version: 3, Status: domain.StatusCanceled}, tc.err)
			if n := len(store.Events(orderID)); tc.err != nil && n != 2 {
				t.Fatalf("stream has %d events after a failed precondition, want 2", n)
			}
			if n := store.Appends.Load() - appends; n > 1 && !tc.ifMatch.Any {
				t.Fatalf("%d appends with If-Match, want at most 1 (no retry)", n)
			}
		})
	}
}

// TestServiceIfMatchNoOrder: no precondition holds for an order that does
// not exist, "*" included (RFC 9110 §13.1.1): 412, not the 404 of the
// same command without If-Match, and nothing is appended.
func TestServiceIfMatchNoOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  domain.Command
		m    domain.IfMatch
	}{
		{"any", domain.Approve{}, domain.IfMatch{Any: true}},
		{"a version", domain.Approve{}, domain.IfMatch{Versions: []int64{1}}},
		{"version 0", domain.Approve{}, domain.IfMatch{Versions: []int64{0}}},
		{"any, placing", domain.PlaceOrder{CustomerID: "c-1", Currency: "BRL", Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 100}}},
			domain.IfMatch{Any: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemStore()
			svc := newService(store, true)
			_, err := svc.Execute(ctx, "no-such-order", tc.cmd, domain.ExecOptions{IfMatch: &tc.m})
			if !errors.Is(err, domain.ErrPreconditionFailed) {
				t.Errorf("Execute = %v, want ErrPreconditionFailed", err)
			}
			if n := store.Appends.Load(); n != 0 {
				t.Errorf("%d appends", n)
			}
		})
	}
}

// warm, cold and stale return a Service on store, where orderID is approved
// (v2), whose cache holds v2, nothing, or v1 (created).
func warm(t *testing.T, store *domaintest.MemStore) *domain.Service {
	svc := newService(store, true)
	placedOrder(t, svc, domain.Approve{})
	return svc
}

func cold(t *testing.T, store *domaintest.MemStore) *domain.Service {
	warm(t, store)
	return newService(store, true)
}

func stale(t *testing.T, store *domaintest.MemStore) *domain.Service {
	svc := newService(store, true)
	placedOrder(t, svc)
	if _, err := newService(store, false).Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestServiceStaleCache: the cache holds v1 (created) while the log is at
// v2 (approved); the log's state decides.
func TestServiceStaleCache(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cmd    domain.Command
		want   domain.Result
		err    error
		events int
	}{
		// Legal in both: the append loses the version race and is retried.
		{"legal in both", domain.Cancel{Reason: "r"},
			domain.Result{OrderID: orderID, Version: 3, Status: domain.StatusCanceled, Attempts: 2}, nil, 3},
		{"illegal in the cache only", domain.Invoice{},
			domain.Result{OrderID: orderID, Version: 3, Status: domain.StatusInvoiced, Attempts: 1}, nil, 3},
		{"legal in the cache only", domain.Approve{}, domain.Result{}, domain.ErrInvalidTransition, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemStore()
			svc := stale(t, store)
			r, err := svc.Execute(ctx, orderID, tc.cmd, domain.ExecOptions{})
			expect(t, r, err, tc.want, tc.err)
			assertStream(t, store, tc.events)
			if tc.err != nil {
				// The refusal evicted the stale entry: a legal command now
				// wins its first append.
				r, err := svc.Execute(ctx, orderID, domain.Cancel{}, domain.ExecOptions{})
				expect(t, r, err, domain.Result{OrderID: orderID, Version: 3, Status: domain.StatusCanceled, Attempts: 1}, nil)
			}
		})
	}
}

func TestServiceRefusalsAppendNothing(t *testing.T) {
	bad := placeCmd()
	bad.Items[0].Quantity = 0
	for _, tc := range []struct {
		name    string
		orderID string
		cmd     domain.Command
		err     error
	}{
		{"invalid transition", orderID, domain.Deliver{}, domain.ErrInvalidTransition},
		{"unknown order", "o-2", domain.Approve{}, domain.ErrNotFound},
		{"bad order id", "o.1", domain.Approve{}, domain.ErrValidation},
		{"bad placement", "o-2", bad, domain.ErrValidation},
		{"reason too long", orderID, domain.Cancel{Reason: string(make([]byte, 501))}, domain.ErrValidation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemStore()
			svc := newService(store, true)
			placedOrder(t, svc)
			appends := store.Appends.Load()
			_, err := svc.Execute(ctx, tc.orderID, tc.cmd, domain.ExecOptions{IdempotencyKey: "k"})
			expect(t, domain.Result{}, err, domain.Result{}, tc.err)
			if n := store.Appends.Load() - appends; n != 0 || store.Keys() != 0 {
				t.Fatalf("%d appends, %d keys stored; want none", n, store.Keys())
			}
		})
	}
}

// assertStream checks the stream has n events with contiguous versions and
// the metadata of the Service.
func assertStream(t *testing.T, store *domaintest.MemStore, n int) []domain.Event {
	t.Helper()
	evs := store.Events(orderID)
	if len(evs) != n {
		t.Fatalf("stream has %d events, want %d", len(evs), n)
	}
	ids := map[string]bool{}
	for i, e := range evs {
		if e.Version != int64(i+1) || e.StreamID != orderID || e.StreamType != domain.StreamTypeOrder ||
			e.Type != e.Data.EventType() || e.Metadata.SchemaVersion != domain.CurrentSchema(e.Type) || e.ID == "" || ids[e.ID] ||
			!reflect.DeepEqual(e.RecordedAt, domain.Timestamp(storeNow)) {
			t.Fatalf("event %d: %+v", i, e)
		}
		ids[e.ID] = true
	}
	return evs
}

func TestServiceEventMetadata(t *testing.T) {
	store := newMemStore()
	svc := newService(store, true)
	_, err := svc.Execute(ctx, orderID, placeCmd(), domain.ExecOptions{CorrelationID: "corr-1", CommandID: "cmd-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{CommandID: "cmd-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Execute(ctx, orderID, domain.Ship{}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	evs := assertStream(t, store, 3)
	// OrderPlaced is at schema 2 (line freight), the others at 1.
	want := []domain.Metadata{{CorrelationID: "corr-1", CausationID: "cmd-1", SchemaVersion: 2}, {CorrelationID: "cmd-2", CausationID: "cmd-2", SchemaVersion: 1}}
	for i, w := range want {
		if evs[i].Metadata != w {
			t.Errorf("event %d metadata = %+v, want %+v", i+1, evs[i].Metadata, w)
		}
	}
	if m := evs[2].Metadata; m.CausationID == "" || m.CorrelationID != m.CausationID || m.CausationID == evs[2].ID {
		t.Errorf("event 3 metadata = %+v: want a generated command id as causation and correlation", m)
	}
	// The events survive the wire form.
	for _, e := range evs {
		b, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := domain.UnmarshalEvent(b); err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("wire round trip = %+v, %v; want %+v", got, err, e)
		}
	}
}

// conflictStore loses every version race.
type conflictStore struct{ *domaintest.MemStore }

func (s conflictStore) Append(context.Context, domain.Commit) (time.Time, error) {
	s.Appends.Add(1)
	return time.Time{}, fmt.Errorf("always: %w", domain.ErrVersionConflict)
}

func TestServiceRetriesExhausted(t *testing.T) {
	mem := newMemStore()
	placedOrder(t, newService(mem, false))
	store := conflictStore{mem}
	svc := newService(store, true)
	svc.MaxAttempts = 3
	before := mem.Appends.Load()
	r, err := svc.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{})
	if !errors.Is(err, domain.ErrVersionConflict) || r.Attempts != 3 || mem.Appends.Load()-before != 3 {
		t.Fatalf("Execute = %+v, %v after %d appends; want ErrVersionConflict after 3", r, err, mem.Appends.Load()-before)
	}
	before = mem.Appends.Load()
	if _, err := svc.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{IfMatch: &domain.IfMatch{Versions: []int64{1}}}); !errors.Is(err, domain.ErrPreconditionFailed) || mem.Appends.Load()-before != 1 {
		t.Fatalf("If-Match conflict = %v after %d appends, want ErrPreconditionFailed after 1", err, mem.Appends.Load()-before)
	}
	// "*" holds whatever version the order reaches: a lost race is
	// retried as without If-Match.
	before = mem.Appends.Load()
	if r, err := svc.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{IfMatch: &domain.IfMatch{Any: true}}); !errors.Is(err, domain.ErrVersionConflict) || r.Attempts != 3 {
		t.Fatalf("If-Match * = %+v, %v after %d appends; want ErrVersionConflict after 3", r, err, mem.Appends.Load()-before)
	}
	svc.BaseBackoff = time.Hour
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := svc.Execute(cctx, orderID, domain.Approve{}, domain.ExecOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Execute with a canceled context = %v, want context.Canceled", err)
	}
}

func TestServiceConcurrentApprove(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared service=%v", shared), func(t *testing.T) {
			store := newMemStore()
			svc := newService(store, true)
			placedOrder(t, svc)
			const n = 16
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				s := svc
				if !shared {
					s = newService(store, false)
				}
				wg.Go(func() { _, errs[i] = s.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{}) })
			}
			wg.Wait()
			ok := 0
			for _, err := range errs {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, domain.ErrInvalidTransition):
					t.Errorf("Execute = %v, want ErrInvalidTransition", err)
				}
			}
			if ok != 1 {
				t.Fatalf("%d approvals succeeded, want 1", ok)
			}
			if evs := assertStream(t, store, 2); evs[1].Type != domain.TypeOrderApproved {
				t.Fatalf("second event is %s", evs[1].Type)
			}
		})
	}
}

// Get answers from the cache only after the log confirms nothing follows
// the cached state: another instance's appends are seen at once.
func TestServiceGetRefreshesCachedState(t *testing.T) {
	store := newMemStore()
	a, b := newService(store, true), newService(store, true)
	if _, err := a.Execute(ctx, orderID, placeCmd(), domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Execute(ctx, orderID, domain.Approve{At: at(1)}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	o, err := a.Get(ctx, orderID)
	if err != nil || o.Version != 2 || o.Status != domain.StatusApproved || o.ApprovedAt == nil {
		t.Fatalf("Get through a stale cache = %+v, %v; want v2 approved", o, err)
	}
	want, _, err := a.EventsUntil(ctx, orderID, domain.Bound{})
	if err != nil || !reflect.DeepEqual(o, want) {
		t.Fatalf("Get = %+v, fold of the log = %+v (%v)", o, want, err)
	}
	for _, id := range []string{"nope", "a.b"} {
		if _, err := a.Get(ctx, id); err == nil {
			t.Errorf("Get(%q) = nil error", id)
		}
	}
}

// A place retried with its Idempotency-Key after the order moved on
// answers with the first result, not the order's state today.
func TestServicePlaceRetryAfterOrderMovedOn(t *testing.T) {
	store := newMemStore()
	svc := newService(store, true)
	key := domain.ExecOptions{IdempotencyKey: "k-place"}
	if _, err := svc.Execute(ctx, orderID, placeCmd(), key); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Execute(ctx, orderID, domain.Approve{}, domain.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := svc.Execute(ctx, orderID, placeCmd(), key)
	expect(t, r, err, domain.Result{OrderID: orderID, Version: 1, Status: domain.StatusCreated, Replayed: true}, nil)
	if n := store.Commits(); n != 2 {
		t.Fatalf("%d commits, want 2", n)
	}
}

// With the store unreachable a command fails after one store call, with
// ErrUnavailable: re-deciding on the log or looking up the idempotency key
// would only wait for the store again, so the client's 503 would come
// later and say nothing more.
func TestServiceStoreDownFailsAfterOneCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached bool
		cmd    domain.Command
		key    string
	}{
		{"place", false, placeCmd(), ""},
		{"place with key", false, placeCmd(), "k-place"},
		{"approve", false, domain.Approve{}, ""},
		{"approve, state cached", true, domain.Approve{}, "k-approve"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMemStore()
			svc := newService(mem, tc.cached)
			id := orderID
			if _, ok := tc.cmd.(domain.PlaceOrder); ok {
				id = "o-new"
			} else {
				placedOrder(t, svc) // warms the cache when there is one
			}
			mem.Down.Store(true)
			_, err := svc.Execute(ctx, id, tc.cmd, domain.ExecOptions{IdempotencyKey: tc.key})
			if !errors.Is(err, domain.ErrUnavailable) {
				t.Fatalf("Execute with the store down: %v; want ErrUnavailable", err)
			}
			if n := mem.DownCalls.Load(); n != 1 {
				t.Errorf("Execute called the unreachable store %d times, want 1", n)
			}
		})
	}
}

// TestServiceEventsUntil: given a stream of three commits recorded a
// minute apart, a bound by version or by recorded time folds a prefix, and
// a bound outside the stream is ErrNotFound naming the head.
func TestServiceEventsUntil(t *testing.T) {
	store := domaintest.NewMemStore()
	var n atomic.Int64
	store.Now = func() time.Time { return storeNow.Add(time.Duration(n.Add(1)) * time.Minute) }
	svc := newService(store, true)
	placedOrder(t, svc, domain.Approve{}, domain.Ship{})
	rec := func(v int64) time.Time { return domain.Timestamp(storeNow.Add(time.Duration(v) * time.Minute)) }
	for _, tc := range []struct {
		name    string
		b       domain.Bound
		version int64
		status  domain.Status
		err     error
		detail  string
	}{
		{"version 1", domain.Bound{Version: 1}, 1, domain.StatusCreated, nil, ""},
		{"version 3", domain.Bound{Version: 3}, 3, domain.StatusShipped, nil, ""},
		{"past the head", domain.Bound{Version: 4}, 0, "", domain.ErrNotFound, "head is v3"},
		{"at the second commit", domain.Bound{At: rec(2)}, 2, domain.StatusApproved, nil, ""},
		{"between commits", domain.Bound{At: rec(2).Add(30 * time.Second)}, 2, domain.StatusApproved, nil, ""},
		{"before the first", domain.Bound{At: rec(1).Add(-time.Millisecond)}, 0, "", domain.ErrNotFound, "head v3"},
		{"after the head", domain.Bound{At: rec(9)}, 3, domain.StatusShipped, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, evs, err := svc.EventsUntil(ctx, orderID, tc.b)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.detail) {
					t.Fatalf("EventsUntil = %v, want %v saying %q", err, tc.err, tc.detail)
				}
				return
			}
			if err != nil || o.Version != tc.version || o.Status != tc.status || int64(len(evs)) != tc.version {
				t.Fatalf("EventsUntil = v%d %s, %d events, %v; want v%d %s", o.Version, o.Status, len(evs), err, tc.version, tc.status)
			}
			if !o.RecordedAt.Equal(rec(tc.version)) {
				t.Errorf("recorded_at %v, want %v", o.RecordedAt, rec(tc.version))
			}
		})
	}
	if _, _, err := svc.EventsUntil(ctx, "nope", domain.Bound{Version: 1}); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("unknown order: %v, want ErrNotFound", err)
	}
	if _, _, err := svc.EventsUntil(ctx, "bad id!", domain.Bound{Version: 1}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("invalid id: %v, want ErrValidation", err)
	}
}
