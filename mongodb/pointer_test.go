package mongodb_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
