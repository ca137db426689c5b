package eventstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
)

func TestLease(t *testing.T) {
	const ttl = 300 * time.Millisecond
	ctx := t.Context()
	db := storetest.Database(t)
	name := storetest.Unique("relay-")
	// Claims that must exclude the other owner last a minute, so a slow
	// machine cannot let them expire between two steps; the expiry step
	// uses a claim of ttl.
	a := eventstore.NewLease(db, name, "a", time.Minute)
	b := eventstore.NewLease(db, name, "b", time.Minute)
	aShort := eventstore.NewLease(db, name, "a", ttl)
	try := func(l *eventstore.Lease, who string, want bool) {
		t.Helper()
		got, err := l.TryAcquire(ctx)
		if err != nil || got != want {
			t.Fatalf("%s: TryAcquire = %v, %v; want %v", who, got, err, want)
		}
	}

	try(a, "a claims the free lease", true)
	try(b, "b while a holds it", false)
	try(a, "a renews", true)
	try(b, "b after a renewed", false)
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b releases a lease it does not hold: %v", err)
	}
	try(b, "b after its own release of a's lease", false)

	// a renews for ttl only and then stops: b gets the lease once that
	// claim has expired, not before.
	renewed := time.Now() // before the claim: a's expiry is at least this + ttl
	try(aShort, "a renews for the short ttl", true)
	storetest.WaitFor(t, 5*time.Second, "b to take over the expired lease", func() bool {
		ok, err := b.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("b: %v", err)
		}
		return ok
	})
	if took := time.Since(renewed); took < ttl-5*time.Millisecond {
		t.Errorf("b took the lease %v after a's renewal; the TTL is %v", took, ttl)
	}
	try(a, "a after b took over", false)
	try(aShort, "a (short ttl) after b took over", false)
	try(b, "b renews", true)

	// Release hands over at once.
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b releases: %v", err)
	}
	try(a, "a right after b's release", true)
	try(b, "b after a took over", false)

	// Many claimants of a free lease: exactly one wins.
	other := storetest.Unique("job-")
	const claimants = 8
	wins := make([]bool, claimants)
	errs := make([]error, claimants)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claimants {
		wg.Go(func() {
			<-start
			wins[i], errs[i] = eventstore.NewLease(db, other, fmt.Sprintf("c%d", i), time.Minute).TryAcquire(ctx)
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for i := range claimants {
		if errs[i] != nil {
			t.Errorf("claimant %d: %v", i, errs[i])
		}
		if wins[i] {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d of %d claimants hold the lease, want 1", won, claimants)
	}
}
