package jobs_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestNewProjectionIsBuiltBeforeItServes: a projection a log already has
// events for, but no documents and no pointer, is not read until a jobs
// worker has built it from the log, verified and switched to it.
func TestNewProjectionIsBuiltBeforeItServes(t *testing.T) {
	ctx := projectiontest.Context(t, 3*time.Minute)
	es, db := storetest.OpenStore(t)
	k, f := newKit(t, ctx, es, db, "new", 30, 4)
	if err := k.ps.Ensure(ctx, k.sums.Name(), k.sums.Collection(), k.sums.Version()); err != nil {
		t.Fatal(err)
	}
	ptr, err := k.sums.Pointer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != "" || ptr.ActiveVer() != 0 || ptr.Generation != 1 {
		t.Fatalf("pointer of a projection new to a log with events: %+v; want no active collection", ptr)
	}
	reader := mongodb.NewReader(k.db, k.ps, nil)
	id := f.IDs[0]
	if _, err := reader.Summary(ctx, id); !errors.Is(err, domain.ErrNotBuilt) {
		t.Fatalf("read before the build: %v; want ErrNotBuilt", err)
	}
	if _, err := k.jobs.StartVerify(ctx, projection.OrderSummaries.Name, false); !errors.Is(err, domain.ErrNotBuilt) {
		t.Errorf("verify before the build: %v; want ErrNotBuilt", err)
	}
	// A second process agrees and writes nothing.
	if err := k.ps.Ensure(ctx, k.sums.Name(), k.sums.Collection(), k.sums.Version()); err != nil {
		t.Fatal(err)
	}
	k.worker(t, "builder", jobs.WorkerConfig{})
	projectiontest.WaitFor(t, 2*time.Minute, "the first build switched", func() error {
		p, err := k.sums.Pointer(ctx, 0)
		if err != nil {
			return err
		}
		if p.ActiveVer() != projection.OrderSummaries.Ver() {
			return errors.New("not switched yet")
		}
		ptr = p
		return nil
	})
	if ptr.Previous != "" || ptr.Shadow != "" {
		t.Errorf("after the first build: %+v; want nothing previous, no shadow", ptr)
	}
	got, err := reader.Summary(ctx, id)
	if err != nil || got.Version != f.Orders[id].Version {
		t.Fatalf("read after the build: %+v, %v; want the fold at v%d", got, err, f.Orders[id].Version)
	}
	if rep := k.verify(t, ctx, false); rep.Drift() != 0 || rep.Documents != int64(len(f.Orders)) {
		t.Errorf("verify after the build: %+v", rep)
	}
	if _, err := k.jobs.SwitchBack(ctx, projection.OrderSummaries.Name); !errors.Is(err, domain.ErrNoPrevious) {
		t.Errorf("switch back after a first build: %v; want ErrNoPrevious", err)
	}
}

// TestSwitchBack: after a rebuild the replaced collection is the
// previous one; a switch back swaps them, twice over; once its grace is
// over the previous collection is unnamed and dropped, and there is
// nothing to switch back to.
func TestSwitchBack(t *testing.T) {
	ctx, k, f := projectedKit(t, 3*time.Minute, "back", 20, 3)
	name := projection.OrderSummaries.Name
	if _, err := k.jobs.SwitchBack(ctx, name); !errors.Is(err, domain.ErrNoPrevious) {
		t.Fatalf("switch back with no switch yet: %v; want ErrNoPrevious", err)
	}
	k.worker(t, "w", jobs.WorkerConfig{Grace: time.Hour})
	job, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if job = k.waitJob(t, ctx, job.ID, 2*time.Minute); job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %+v", job)
	}
	ptr, err := k.sums.Pointer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Active != job.Shadow || ptr.Previous != "order_summaries" || ptr.PreviousVer() != projection.OrderSummaries.Ver() {
		t.Fatalf("after the rebuild: %+v; want %s active, order_summaries previous", ptr, job.Shadow)
	}
	// Writes of this version go to both, the previous one included.
	more := projectiontest.NewFixture(t, ctx, k.es, "back-more", 3, 1)
	if _, _, err := k.sums.Apply(ctx, more.Flat, false); err != nil {
		t.Fatal(err)
	}
	for _, coll := range []string{job.Shadow, "order_summaries"} {
		n, err := k.db.Collection(coll).CountDocuments(ctx, bson.D{})
		if err != nil || n != int64(len(f.Orders)+len(more.Orders)) {
			t.Errorf("%s holds %d documents (%v); want %d: live writes go to the previous collection too", coll, n, err, len(f.Orders)+len(more.Orders))
		}
	}

	back, err := k.jobs.SwitchBack(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if back.Active != "order_summaries" || back.Previous != job.Shadow || back.SwitchedBackFrom != 0 || back.Generation != ptr.Generation+1 {
		t.Errorf("after the switch back: %+v; want order_summaries active, %s previous, same version so nothing refused", back, job.Shadow)
	}
	again, err := k.jobs.SwitchBack(ctx, name)
	if err != nil || again.Active != job.Shadow || again.Previous != "order_summaries" {
		t.Fatalf("switch back again: %+v, %v", again, err)
	}
	// The grace of what is previous now runs out: it is unnamed, dropped
	// (with the sums of the rebuild, kept on the drop list as long).
	dropped, err := k.ps.DropRetired(ctx, time.Now().Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	after, err := k.sums.Pointer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dropped)
	if want := []string{"order_summaries", projection.SumsCollection(job.Shadow)}; after.Previous != "" || after.Active != job.Shadow || !slices.Equal(dropped, want) {
		t.Errorf("after the grace: pointer %+v, dropped %v; want %s active, %v dropped", after, dropped, job.Shadow, want)
	}
	if _, err := k.jobs.SwitchBack(ctx, name); !errors.Is(err, domain.ErrNoPrevious) {
		t.Errorf("switch back after the grace: %v; want ErrNoPrevious", err)
	}

	second, err := k.jobs.StartRebuild(ctx, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if second = k.waitJob(t, ctx, second.ID, 2*time.Minute); second.State != jobs.StateSucceeded {
		t.Fatalf("second rebuild: %+v", second)
	}
	if back, err := k.jobs.SwitchBack(ctx, name); err != nil || back.Active != job.Shadow {
		t.Fatalf("switch back from the second rebuild: %+v, %v; want %s active", back, err, job.Shadow)
	}
}

// TestVersionsClaimTheirOwnJobs: a rebuild started by an instance that
// folds the next version (v2 below) is run only by workers of that
// version; an instance of the current one (v1) cannot rebuild or verify
// once v2 is active.
func TestVersionsClaimTheirOwnJobs(t *testing.T) {
	ctx, k, f := projectedKit(t, 3*time.Minute, "ver", 20, 3)
	v1, v2 := projection.OrderSummaries, projection.OrderSummaries
	v2.Version = v1.Ver() + 1
	prefix := projection.VersionKey(v2.Collection, v2.Ver()) + "_"
	sums2 := mongodb.NewProjection(k.db, v2, k.es, nil, k.ps)
	jobs2 := jobs.New(mongodb.NewJobs(k.db), k.ps, k.es, sums2)
	// The store as a v1 service left it.
	if _, err := k.ps.Update(ctx, v1.Name, v1.Collection, func(p *projection.Pointer) (bool, error) {
		p.ActiveVersion = v1.Ver()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// A v1 worker only: the v2 build waits.
	k.worker(t, "v1", jobs.WorkerConfig{})
	job, err := jobs2.StartRebuild(ctx, v2.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if job.Version != v2.Ver() || !strings.HasPrefix(job.Shadow, prefix) {
		t.Fatalf("the v2 rebuild: %+v", job)
	}
	// A v1 job runs on the v1 worker meanwhile.
	check, err := k.jobs.StartVerify(ctx, v2.Name, false)
	if err != nil {
		t.Fatal(err)
	}
	if check = k.waitJob(t, ctx, check.ID, time.Minute); check.Version != v1.Ver() || check.State != jobs.StateSucceeded {
		t.Errorf("the v1 verify: %+v", check)
	}
	if got, _ := k.jobs.Get(ctx, job.ID); got.State.Final() || got.Streams > 0 {
		t.Fatalf("the v2 rebuild ran on a v1 worker: %+v", got)
	}
	w2 := jobs.NewWorker(jobs2, k.es, nil, jobs.WorkerConfig{Owner: "v2", Poll: 50 * time.Millisecond,
		Settle: 300 * time.Millisecond, LeaseTTL: 3 * time.Second}, projectiontest.Logger(t))
	projectiontest.Go(t, "worker v2", w2.Run)
	if job = k.waitJob(t, ctx, job.ID, 2*time.Minute); job.State != jobs.StateSucceeded || job.Report == nil {
		t.Fatalf("the v2 rebuild: %+v", job)
	}
	ptr, err := k.sums.Pointer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ptr.ActiveVer() != v2.Ver() || ptr.Active != job.Shadow || ptr.PreviousVer() != v1.Ver() {
		t.Fatalf("after the v2 build: %+v", ptr)
	}
	if _, err := k.jobs.StartRebuild(ctx, v2.Name, 1); !errors.Is(err, domain.ErrOtherVersion) {
		t.Errorf("a v1 rebuild once v2 is active: %v; want ErrOtherVersion", err)
	}
	if _, err := k.jobs.StartVerify(ctx, v2.Name, false); !errors.Is(err, domain.ErrOtherVersion) {
		t.Errorf("a v1 verify once v2 is active: %v; want ErrOtherVersion", err)
	}
	// The v1 projection writes only the previous collection now.
	more := projectiontest.NewFixture(t, ctx, k.es, "ver-more", 2, 1)
	if _, _, err := k.sums.Apply(ctx, more.Flat, false); err != nil {
		t.Fatal(err)
	}
	n, err := k.db.Collection(job.Shadow).CountDocuments(ctx, bson.D{})
	if err != nil || n != int64(len(f.Orders)) {
		t.Errorf("the v2 collection holds %d documents (%v) after v1 writes; want %d, untouched", n, err, len(f.Orders))
	}
	// Switched back from, v2 is not built again on its own.
	back, err := jobs2.SwitchBack(ctx, v2.Name)
	if err != nil || back.ActiveVer() != v1.Ver() || back.SwitchedBackFrom != v2.Ver() {
		t.Fatalf("switch back to v1: %+v, %v", back, err)
	}
}

// TestNewerVersionSupersedesAnOlderRebuild: a rebuild of the current
// version that no worker of that version is left to run (a rolling
// upgrade replaced them all) holds the projection's rebuild lock. A worker
// of the next version cancels it, cleans it up (its shadow unnamed, the
// lock released), builds the next version and switches to it.
func TestNewerVersionSupersedesAnOlderRebuild(t *testing.T) {
	ctx, k, _ := projectedKit(t, 3*time.Minute, "sup", 20, 3)
	cur, next := projection.OrderSummaries, projection.OrderSummaries
	next.Version = cur.Ver() + 1
	if _, err := k.ps.Update(ctx, cur.Name, cur.Collection, func(p *projection.Pointer) (bool, error) {
		p.ActiveVersion = cur.Ver()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	stuck, err := k.jobs.StartRebuild(ctx, cur.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	sums2 := mongodb.NewProjection(k.db, next, k.es, nil, k.ps)
	jobs2 := jobs.New(mongodb.NewJobs(k.db), k.ps, k.es, sums2)
	w2 := jobs.NewWorker(jobs2, k.es, nil, jobs.WorkerConfig{Owner: "next", Poll: 50 * time.Millisecond,
		Settle: 300 * time.Millisecond, LeaseTTL: 3 * time.Second}, projectiontest.Logger(t))
	projectiontest.Go(t, "worker next", w2.Run)

	if got := k.waitJob(t, ctx, stuck.ID, time.Minute); got.State != jobs.StateCanceled || got.Streams != 0 {
		t.Fatalf("the stuck rebuild of version %d: %+v; want canceled, nothing scanned", cur.Ver(), got)
	}
	var ptr projection.Pointer
	projectiontest.WaitFor(t, 2*time.Minute, "the next version built and switched", func() error {
		if ptr, err = k.sums.Pointer(ctx, 0); err != nil {
			return err
		}
		if ptr.ActiveVer() != next.Ver() {
			return fmt.Errorf("pointer %+v", ptr)
		}
		return nil
	})
	if ptr.Active == stuck.Shadow || ptr.Shadow != "" || ptr.PreviousVer() != cur.Ver() {
		t.Errorf("after the next version's build: %+v; want its own collection active, the stuck shadow unnamed", ptr)
	}
}
