package mongodb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestPointerWritesCompareAndSetTheGeneration: a pointer write made from a
// pointer read at generation g (the way a stalled rebuild finish or
// cleanup makes it) must fail once another write has moved the pointer to
// g+1, and leave that newer pointer as it is; likewise the creation of a
// projection's first pointer, when another one was created meanwhile.
func TestPointerWritesCompareAndSetTheGeneration(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db := storetest.Database(t)
	const name, base = "order_summaries", "order_summaries"
	stored := func() projection.Pointer {
		t.Helper()
		// A Pointers of its own: what the store holds, not this
		// process's cache.
		p, err := mongodb.NewPointers(db).Get(ctx, name, base, 0)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	ps, other := mongodb.NewPointers(db), mongodb.NewPointers(db)
	none, err := ps.Get(ctx, name, base, 0)
	if err != nil {
		t.Fatal(err)
	}
	if none.Generation != 0 {
		t.Fatalf("pointer of a projection never rebuilt: %+v", none)
	}
	first := none
	first.Shadow, first.ShadowJob, first.Generation = base+"_a", "job-a", none.Generation+1
	if err := mongodb.PutPointer(ctx, other, first); err != nil {
		t.Fatalf("create the first pointer: %v", err)
	}
	racer := none
	racer.Shadow, racer.ShadowJob, racer.Generation = base+"_b", "job-b", none.Generation+1
	if err := mongodb.PutPointer(ctx, ps, racer); !errors.Is(err, domain.ErrPointerMoved) {
		t.Errorf("a second first pointer, written over the one created meanwhile: %v, want domain.ErrPointerMoved", err)
	}
	if got := stored(); got != first {
		t.Errorf("pointer after two creations: %+v, want the first %+v", got, first)
	}

	read, err := ps.Get(ctx, name, base, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A newer write (the switch of rebuild a) moves the pointer on.
	newer := read
	newer.Active, newer.Shadow, newer.ShadowJob, newer.Generation = read.Shadow, "", "", read.Generation+1
	if err := mongodb.PutPointer(ctx, other, newer); err != nil {
		t.Fatalf("switch at generation %d: %v", read.Generation, err)
	}
	// The stale write, decided on generation g: a cleanup dropping the
	// shadow it read.
	stale := read
	stale.Shadow, stale.ShadowJob, stale.Generation = "", "", read.Generation+1
	if err := mongodb.PutPointer(ctx, ps, stale); !errors.Is(err, domain.ErrPointerMoved) {
		t.Errorf("a write from generation %d after the pointer moved to %d: %v, want domain.ErrPointerMoved", read.Generation, newer.Generation, err)
	}
	if got := stored(); got != newer {
		t.Errorf("pointer after the stale write: %+v, want the newer %+v", got, newer)
	}

	// Update decides again on the pointer as re-read after a lost
	// compare-and-set: here a rebuild announces its shadow while another
	// one's stalled cleanup still tries to withdraw its own.
	var seen []int64
	got, err := ps.Update(ctx, name, base, func(p *projection.Pointer) (bool, error) {
		seen = append(seen, p.Generation)
		if len(seen) == 1 {
			moved := *p
			moved.Shadow, moved.ShadowJob, moved.Generation = base+"_c", "job-c", p.Generation+1
			if err := mongodb.PutPointer(ctx, other, moved); err != nil {
				t.Fatal(err)
			}
		}
		if p.ShadowJob != "job-c" {
			p.Shadow, p.ShadowJob = base+"_d", "job-d"
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := newer
	want.Shadow, want.ShadowJob, want.Generation = base+"_c", "job-c", newer.Generation+1
	if len(seen) != 2 || seen[1] != want.Generation || got != want || stored() != want {
		t.Errorf("Update over a concurrent write: read generations %v, returned %+v, stored %+v, want %+v", seen, got, stored(), want)
	}
}

// TestWritersNeverActOnAPointerTheyCouldNotRead: with the store stopped, a
// projection's writers get an error instead of the pointer this process
// read before (which may name a collection a rebuild has since retired:
// an upsert there would re-create it after its drop), and its readers keep
// the pointer they had.
func TestWritersNeverActOnAPointerTheyCouldNotRead(t *testing.T) {
	store, err := embedded.StartStore(t.TempDir(), "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := mongo.Connect(options.Client().ApplyURI(store.URI).SetServerSelectionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	db := c.Database("pointers")
	ps := mongodb.NewPointers(db)
	p := mongodb.NewProjection(db, projection.OrderSummaries, nil, nil, ps)
	read, err := p.Pointer(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}

	_ = store.Close()
	if _, _, err := p.Apply(t.Context(), []domain.Event{{StreamID: "o-1", Version: 1}}, false); !errors.Is(err, domain.ErrUnavailable) {
		t.Errorf("apply with the store stopped: %v, want ErrUnavailable before any write", err)
	}
	if got, err := ps.Get(t.Context(), projection.OrderSummaries.Name, projection.OrderSummaries.Collection, 0); err == nil {
		t.Errorf("a writer's pointer with the store stopped: %+v, want an error", got)
	}
	if got, err := ps.Last(t.Context(), projection.OrderSummaries.Name, projection.OrderSummaries.Collection, 0); err != nil || got != read {
		t.Errorf("a reader's pointer with the store stopped: %+v, %v; want %+v, the one read before", got, err, read)
	}
}

// TestLiveReadModelUnderTheProjectionsName: a person who reads the
// projection's own name with a plain find (as mongosh does) gets the live
// read model: the base collection while the pointer names it, then,
// once it is dropped, a view that follows the active collection through
// a switch, a switch back, and a view another instance left pointing at
// an older collection.
func TestLiveReadModelUnderTheProjectionsName(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db := storetest.Database(t)
	const name, base = "order_summaries", "order_summaries"
	v2, v3 := base+"_v2_a", base+"_v3_b"
	for _, coll := range []string{base, v2, v3} {
		if _, err := db.Collection(coll).InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}, {Key: "in", Value: coll}}); err != nil {
			t.Fatal(err)
		}
	}
	ps := mongodb.NewPointers(db)
	shows := func(when, want string) {
		t.Helper()
		if err := ps.ShowLive(ctx, name, base); err != nil {
			t.Fatalf("%s: show the live read model: %v", when, err)
		}
		var doc struct{ In string }
		if err := db.Collection(base).FindOne(ctx, bson.D{{Key: "_id", Value: "o-1"}}).Decode(&doc); err != nil || doc.In != want {
			t.Errorf("%s: find on %s reads %q, %v; want %q", when, base, doc.In, err, want)
		}
	}
	move := func(change func(p *projection.Pointer)) {
		t.Helper()
		if _, err := ps.Update(ctx, name, base, func(p *projection.Pointer) (bool, error) { change(p); return true, nil }); err != nil {
			t.Fatal(err)
		}
	}

	shows("no pointer document", base)
	move(func(p *projection.Pointer) { p.Active, p.ActiveVersion = base, 1 })
	shows("base collection active", base)
	move(func(p *projection.Pointer) { p.Previous, p.PreviousVersion, p.Active, p.ActiveVersion = base, 1, v2, 2 })
	shows("base collection previous, in its grace", base)
	if err := ps.Retire(ctx, name, base, "replaced", time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.DropRetired(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A late write of a projector acting on the pointer it read before
	// the drop re-creates the base collection: it is retired again, and
	// the name becomes the view once it is dropped.
	if _, err := db.Collection(base).InsertOne(ctx, bson.D{{Key: "_id", Value: "o-1"}, {Key: "in", Value: "stray"}}); err != nil {
		t.Fatal(err)
	}
	shows("base collection re-created by a late write", "stray")
	if _, retired, err := ps.DropAfter(ctx, base); err != nil || !retired {
		t.Fatalf("the re-created base collection is not retired again (%v)", err)
	}
	if _, err := ps.DropRetired(ctx, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	shows("base collection dropped", v2)
	specs, err := db.ListCollectionSpecifications(ctx, bson.D{{Key: "name", Value: base}})
	if err != nil || len(specs) != 1 || specs[0].Type != "view" {
		t.Errorf("listCollections of %s: %+v, %v; want one view", base, specs, err)
	}
	move(func(p *projection.Pointer) { p.Previous, p.PreviousVersion, p.Active, p.ActiveVersion = v2, 2, v3, 3 })
	shows("switched to version 3", v3)
	move(func(p *projection.Pointer) { p.Previous, p.PreviousVersion, p.Active, p.ActiveVersion = v3, 3, v2, 2 })
	shows("switched back to version 2", v2)

	// Another instance, acting on the pointer it read before the switch
	// back, repoints the view: the next pass of a fresh process mends it.
	if err := db.RunCommand(ctx, bson.D{{Key: "collMod", Value: base}, {Key: "viewOn", Value: v3}, {Key: "pipeline", Value: bson.A{}}}).Err(); err != nil {
		t.Fatal(err)
	}
	ps = mongodb.NewPointers(db)
	shows("view left on an older collection", v2)
}
