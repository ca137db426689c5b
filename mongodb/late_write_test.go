package mongodb_test

import (
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestLateWriteNeverMovesADocumentBack is invariant 4's last sentence with
// a real stall: a writer (a partition owner about to be deposed) reaches
// the store through a proxy that holds its write of v4 on the wire; its
// successor, on its own connection, writes v4 to v6; then the held write
// lands. The version guard refuses it, and the document stays at v6 with
// the state of v6, on both dialects' paths.
func TestLateWriteNeverMovesADocumentBack(t *testing.T) {
	for _, dialect := range []mongodb.Dialect{mongodb.DialectMongoDB, mongodb.DialectFerretDB} {
		t.Run(dialect.String(), func(t *testing.T) {
			ctx := projectiontest.Context(t, time.Minute)
			es, db := storetest.OpenStore(t)
			f := projectiontest.NewFixture(t, ctx, es, "late", 1, 1)
			id := f.IDs[0]
			evs := f.Events[id]
			if len(evs) < 5 {
				t.Fatalf("the fixture's stream has %d events, want at least 5", len(evs))
			}
			held := len(evs) - 3 // index of the event whose write stalls

			c, proxy := storetest.HeldClient(t)
			mongodb.UseDialect(c, dialect)
			mongodb.UseDialect(db.Client(), dialect)
			deposed := mongodb.NewReadModel(c.Database(db.Name()), projection.OrderSummaries, es, nil)
			successor := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil)

			if _, _, err := deposed.Apply(ctx, evs[:held]); err != nil {
				t.Fatal(err)
			}
			proxy.Hold()
			type result struct {
				out projection.Outcome
				err error
			}
			late := make(chan result, 1)
			go func() {
				out, _, err := deposed.Apply(ctx, evs[held:held+1])
				late <- result{out, err}
			}()
			proxy.WaitHeld(t, []byte("\x02update\x00"), 30*time.Second)

			if _, _, err := successor.Apply(ctx, evs[held:]); err != nil {
				t.Fatal(err)
			}
			proxy.Release()
			r := <-late
			if r.err != nil {
				t.Fatalf("the late write: %v", r.err)
			}
			if r.out.Superseded != 1 {
				t.Errorf("the late write's outcome %+v, want it superseded", r.out)
			}
			got, err := mongodb.Doc[domain.Order](ctx, db, projection.OrderSummaries.Collection, id)
			if err != nil {
				t.Fatal(err)
			}
			want := f.Orders[id]
			if got.Version != want.Version || got.Status != want.Status {
				t.Fatalf("after the late write of v%d the summary is v%d %s, want v%d %s", evs[held].Version, got.Version, got.Status, want.Version, want.Status)
			}
		})
	}
}
