package mongodb_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/lease"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
)

// The lease conformance suite: what every holder of a lease relies on
// (invariant 6), against MONGODB_URI or the embedded store. Claims that
// must exclude another holder last a minute, so that a slow machine cannot
// let them expire between two steps; the expiry steps use short ones.

func TestLeaseClaimRenewRelease(t *testing.T) {
	ctx := t.Context()
	leases := mongodb.NewLeases(storetest.Database(t), mongodb.LeasesCollection)
	name := storetest.Unique("lease-")

	a, ok, err := leases.Claim(ctx, name, "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("a claims a lease nobody held: %v, %v", ok, err)
	}
	if a.Epoch != 1 || a.Holder != "a" || a.Name != name || !a.ExpiresAt.Equal(a.RenewedAt.Add(time.Minute)) {
		t.Fatalf("first claim = %+v; want epoch 1, holder a, expiring a minute after its claim", a)
	}
	if _, ok, err := leases.Claim(ctx, name, "b", time.Minute); err != nil || ok {
		t.Fatalf("b claims a's lease: %v, %v; want false, nil", ok, err)
	}
	stored, err := leases.Get(ctx, name)
	if err != nil || stored.Holder != "a" || stored.Epoch != 1 || !stored.ExpiresAt.After(time.Now()) {
		t.Fatalf("stored = %+v, %v; want a's claim at epoch 1", stored, err)
	}

	renewed, err := leases.Renew(ctx, a, time.Minute)
	if err != nil {
		t.Fatalf("a renews: %v", err)
	}
	if renewed.Epoch != a.Epoch || renewed.RenewedAt.Before(a.RenewedAt) || renewed.AcquiredAt != a.AcquiredAt {
		t.Fatalf("renewed = %+v; want the same claim (%+v) renewed later", renewed, a)
	}

	if err := leases.Release(ctx, renewed); err != nil {
		t.Fatalf("a releases: %v", err)
	}
	b, ok, err := leases.Claim(ctx, name, "b", time.Minute)
	if err != nil || !ok {
		t.Fatalf("b claims right after a's release: %v, %v; want the lease", ok, err)
	}
	if b.Epoch != 2 {
		t.Fatalf("b's epoch = %d; want 2", b.Epoch)
	}
	if _, err := leases.Get(ctx, storetest.Unique("none-")); !errors.Is(err, domain.ErrNotFound) {
		t.Fatalf("Get of a lease never claimed: %v; want domain.ErrNotFound", err)
	}
}

// A holder deposed by a takeover, or by its own later claim under the same
// name (a restart under the same instance id), has its renewal and its
// release refused by the epoch, and cannot take the lease back while its
// successor holds it.
func TestLeaseFencesADeposedHolder(t *testing.T) {
	const ttl = 300 * time.Millisecond
	ctx := t.Context()
	leases := mongodb.NewLeases(storetest.Database(t), mongodb.LeasesCollection)
	name := storetest.Unique("lease-")

	old, ok, err := leases.Claim(ctx, name, "a", ttl)
	if err != nil || !ok {
		t.Fatalf("a claims: %v, %v", ok, err)
	}
	var b lease.Lease
	projectiontest.WaitFor(t, 5*time.Second, "b to take over a's expired lease", func() error {
		var err error
		b, ok, err = leases.Claim(ctx, name, "b", time.Minute)
		if err != nil {
			t.Fatalf("b claims: %v", err)
		}
		if !ok {
			return errors.New("b's claim refused")
		}
		return nil
	})
	if took := time.Since(old.RenewedAt); took < ttl {
		t.Errorf("b took the lease %v after a's claim; the TTL is %v", took, ttl)
	}
	if b.Epoch <= old.Epoch {
		t.Fatalf("b's epoch %d is not above a's %d", b.Epoch, old.Epoch)
	}
	if _, err := leases.Renew(ctx, old, ttl); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("a's renewal after b's takeover: %v; want domain.ErrLeaseLost", err)
	}
	if err := leases.Release(ctx, old); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("a's release after b's takeover: %v; want domain.ErrLeaseLost", err)
	}
	if _, ok, err := leases.Claim(ctx, name, "a", ttl); err != nil || ok {
		t.Fatalf("a claims b's lease: %v, %v; want false, nil", ok, err)
	}
	if stored, err := leases.Get(ctx, name); err != nil || stored.Holder != "b" || stored.Epoch != b.Epoch {
		t.Fatalf("stored = %+v, %v; want b's claim untouched by a", stored, err)
	}

	// b claims again under its own name: the earlier claim is fenced off
	// like another holder's.
	again, ok, err := leases.Claim(ctx, name, "b", time.Minute)
	if err != nil || !ok || again.Epoch != b.Epoch+1 {
		t.Fatalf("b claims its own lease again: %+v, %v, %v; want epoch %d", again, ok, err, b.Epoch+1)
	}
	if _, err := leases.Renew(ctx, b, time.Minute); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("renewal of b's earlier claim: %v; want domain.ErrLeaseLost", err)
	}
	if err := leases.Release(ctx, b); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("release of b's earlier claim: %v; want domain.ErrLeaseLost", err)
	}
	if _, err := leases.Renew(ctx, again, time.Minute); err != nil {
		t.Fatalf("renewal of b's current claim: %v", err)
	}
}

// A claim that expired is renewed while nobody claimed the lease after
// it: a renewal that was slow to get through keeps the lease.
func TestLeaseRenewsAnExpiredClaimNobodyTook(t *testing.T) {
	ctx := t.Context()
	leases := mongodb.NewLeases(storetest.Database(t), mongodb.LeasesCollection)
	name := storetest.Unique("lease-")
	a, ok, err := leases.Claim(ctx, name, "a", 50*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("a claims: %v, %v", ok, err)
	}
	time.Sleep(100 * time.Millisecond)
	renewed, err := leases.Renew(ctx, a, time.Minute)
	if err != nil {
		t.Fatalf("a renews its expired claim: %v", err)
	}
	if _, ok, err := leases.Claim(ctx, name, "b", time.Minute); err != nil || ok {
		t.Fatalf("b claims after a's late renewal: %v, %v; want false, nil", ok, err)
	}
	if renewed.Epoch != a.Epoch {
		t.Fatalf("the renewal changed the epoch: %d, was %d", renewed.Epoch, a.Epoch)
	}
}

// Many claimants race for a lease, first one nobody held and then one
// that expired: exactly one wins each race, and the takeover raises the
// epoch by one.
func TestLeaseExclusiveClaim(t *testing.T) {
	ctx := t.Context()
	leases := mongodb.NewLeases(storetest.Database(t), mongodb.LeasesCollection)
	name := storetest.Unique("lease-")
	race := func(ttl time.Duration) lease.Lease {
		t.Helper()
		const claimants = 8
		won := make([]lease.Lease, claimants)
		wins := make([]bool, claimants)
		errs := make([]error, claimants)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range claimants {
			wg.Go(func() {
				<-start
				won[i], wins[i], errs[i] = leases.Claim(ctx, name, fmt.Sprintf("c%d", i), ttl)
			})
		}
		close(start)
		wg.Wait()
		var winner lease.Lease
		n := 0
		for i := range claimants {
			if errs[i] != nil {
				t.Errorf("claimant %d: %v", i, errs[i])
			}
			if wins[i] {
				n++
				winner = won[i]
			}
		}
		if n != 1 {
			t.Fatalf("%d of %d claimants hold the lease, want 1", n, claimants)
		}
		return winner
	}

	first := race(100 * time.Millisecond)
	if first.Epoch != 1 {
		t.Fatalf("first winner's epoch = %d; want 1", first.Epoch)
	}
	time.Sleep(200 * time.Millisecond)
	second := race(time.Minute)
	if second.Epoch != 2 {
		t.Fatalf("takeover winner's epoch = %d; want 2", second.Epoch)
	}
	if stored, err := leases.Get(ctx, name); err != nil || stored.Holder != second.Holder || stored.Epoch != 2 {
		t.Fatalf("stored = %+v, %v; want the takeover's winner %s at epoch 2", stored, err, second.Holder)
	}
}

// Lease is the claim-or-renew loop of one holder over one named lease.
func TestLeaseTryAcquire(t *testing.T) {
	const ttl = 300 * time.Millisecond
	ctx := t.Context()
	db := storetest.Database(t)
	name := storetest.Unique("relay-")
	a := mongodb.NewLease(db, name, "a", time.Minute)
	b := mongodb.NewLease(db, name, "b", time.Minute)
	aShort := mongodb.NewLease(db, name, "a", ttl)
	try := func(l *mongodb.Lease, who string, want bool) {
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

	// a's other Lease claims under the same name for ttl only and then
	// stops: b gets the lease once that claim has expired, not before.
	claimed := time.Now() // before the claim: its expiry is at least this + ttl
	try(aShort, "a claims again for the short ttl", true)
	projectiontest.WaitFor(t, 5*time.Second, "b to take over the expired lease", func() error {
		ok, err := b.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("b: %v", err)
		}
		if !ok {
			return errors.New("b did not acquire the lease")
		}
		return nil
	})
	if took := time.Since(claimed); took < ttl-5*time.Millisecond {
		t.Errorf("b took the lease %v after a's claim; the TTL is %v", took, ttl)
	}
	try(a, "a after b took over", false)
	try(aShort, "a (short ttl) after b took over", false)
	try(b, "b renews", true)
	if held, ok := b.Held(); !ok || held.Holder != "b" {
		t.Fatalf("b.Held() = %+v, %v", held, ok)
	}

	// Release hands over at once.
	if err := b.Release(ctx); err != nil {
		t.Fatalf("b releases: %v", err)
	}
	if _, ok := b.Held(); ok {
		t.Fatal("b holds a claim after its release")
	}
	try(a, "a right after b's release", true)
	try(b, "b after a took over", false)
}

// A job's task is claimed at the epoch it was read at, by one of many
// runners; the claim records the attempt, and a runner deposed by a
// later claim writes nothing more.
func TestTaskLeases(t *testing.T) {
	ctx := t.Context()
	db := storetest.Database(t)
	store := mongodb.NewJobs(db)
	tasks := store
	read := jobs.Task{ID: "job-1/verify", Job: "job-1", Name: "verify", State: "pending", Cursor: "ord-7", Events: 12}
	if err := store.InsertTasks(ctx, []jobs.Task{read}); err != nil {
		t.Fatal(err)
	}
	load := func() jobs.Task {
		t.Helper()
		got, err := store.Tasks(ctx, read.Job)
		if err != nil || len(got) != 1 {
			t.Fatalf("tasks of %s: %+v, %v", read.Job, got, err)
		}
		return got[0]
	}

	const runners = 6
	claims := make([]lease.Lease, runners)
	wins := make([]bool, runners)
	errs := make([]error, runners)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range runners {
		wg.Go(func() {
			<-start
			_, claims[i], wins[i], errs[i] = tasks.Claim(ctx, read, fmt.Sprintf("w%d", i), 200*time.Millisecond, "running")
		})
	}
	close(start)
	wg.Wait()
	var first lease.Lease
	n := 0
	for i := range runners {
		if errs[i] != nil {
			t.Errorf("runner %d: %v", i, errs[i])
		}
		if wins[i] {
			n, first = n+1, claims[i]
		}
	}
	if n != 1 || first.Epoch != 1 {
		t.Fatalf("%d of %d runners claimed the task (epoch %d); want 1, at epoch 1", n, runners, first.Epoch)
	}
	stored := load()
	if stored.State != "running" || stored.Attempts != 1 || stored.Owner != first.Holder || len(stored.Resumes) != 1 ||
		stored.Resumes[0].Cursor != "ord-7" || stored.StartedAt.IsZero() {
		t.Fatalf("claimed task = %+v", stored)
	}
	if _, _, ok, err := tasks.Claim(ctx, stored, "late", time.Minute, "running"); err != nil || ok {
		t.Fatalf("a claim of the held task: %v, %v; want false, nil", ok, err)
	}

	// The lease runs out; a claim of the task as read before the first
	// claim is refused (stale epoch), one of the task as it is now wins.
	time.Sleep(300 * time.Millisecond)
	if _, _, ok, err := tasks.Claim(ctx, read, "stale", time.Minute, "running"); err != nil || ok {
		t.Fatalf("a claim at the epoch before the first claim: %v, %v; want false, nil", ok, err)
	}
	claimed, second, ok, err := tasks.Claim(ctx, stored, "w9", time.Minute, "running")
	if err != nil || !ok || second.Epoch != 2 || claimed.Attempts != 2 {
		t.Fatalf("w9 claims the expired task: %+v, %+v, %v, %v", claimed, second, ok, err)
	}
	stored.Cursor = "ord-9"
	if err := tasks.Checkpoint(ctx, first, stored); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("the deposed runner's checkpoint: %v; want domain.ErrLeaseLost", err)
	}
	if _, err := tasks.Renew(ctx, first, time.Minute); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("the deposed runner's renewal: %v; want domain.ErrLeaseLost", err)
	}
	if err := tasks.Finish(ctx, first, "done", ""); !errors.Is(err, domain.ErrLeaseLost) {
		t.Fatalf("the deposed runner's finish: %v; want domain.ErrLeaseLost", err)
	}
	if err := tasks.Checkpoint(ctx, second, stored); err != nil {
		t.Fatalf("w9's checkpoint: %v", err)
	}
	if err := tasks.Release(ctx, second, "stopping"); err != nil {
		t.Fatalf("w9's release: %v", err)
	}
	stored = load()
	if stored.Cursor != "ord-9" || stored.Error != "stopping" || stored.LeaseUntil.After(time.Now()) || stored.Epoch != 2 {
		t.Fatalf("task after w9's checkpoint and release = %+v", stored)
	}
}

// Every lease and job write is w:majority, j:true, also on a client whose
// own default is weaker: a claim a failover rolls back would let two
// holders in.
func TestLeaseWritesAreMajorityJournaled(t *testing.T) {
	ctx := t.Context()
	var mu sync.Mutex
	var writes []bson.Raw
	monitor := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		switch e.CommandName {
		case "insert", "update", "findAndModify", "delete":
			mu.Lock()
			writes = append(writes, e.Command)
			mu.Unlock()
		}
	}}
	db := storetest.Connect(t, options.Client().ApplyURI(storetest.MongoURI(t)).SetMonitor(monitor).
		SetWriteConcern(writeconcern.W1()))
	leases := mongodb.NewLeases(db, mongodb.LeasesCollection)
	held, ok, err := leases.Claim(ctx, storetest.Unique("lease-"), "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	if held, err = leases.Renew(ctx, held, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := leases.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	store := mongodb.NewJobs(db)
	if err := store.InsertTasks(ctx, []jobs.Task{{ID: "j/verify", Job: "j", Name: "verify", State: "pending"}}); err != nil {
		t.Fatal(err)
	}
	if err := store.InsertJob(ctx, jobs.Job{ID: "j", Kind: jobs.KindVerify, State: jobs.StateQueued}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := store.Claim(ctx, jobs.Task{ID: "j/verify"}, "a", time.Minute, "running"); err != nil || !ok {
		t.Fatalf("task claim: %v, %v", ok, err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(writes) < 6 {
		t.Fatalf("%d writes seen, want at least 6", len(writes))
	}
	for _, cmd := range writes {
		w, _ := cmd.Lookup("writeConcern", "w").StringValueOK()
		j, _ := cmd.Lookup("writeConcern", "j").BooleanOK()
		if w != "majority" || !j {
			t.Errorf("%s sent writeConcern %s, want {w: majority, j: true}", cmd.Index(0).Key(), cmd.Lookup("writeConcern"))
		}
	}
}
