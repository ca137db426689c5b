package projection_test

import (
	"testing"
	"time"

	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestCheckComparesOnlyWhatItCanFold: an order's check against a
// projection reports "not-built" while no version is built, and
// "other-version" while readers read a version other than the checking
// process's (its fold would call every document different); with the
// process's own version active it compares the document with the fold.
func TestCheckComparesOnlyWhatItCanFold(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	es, db := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "check", 1, 1)
	id := f.IDs[0]
	def := projection.OrderSummaries
	point := func(active string, version int) {
		t.Helper()
		_, err := mongodb.NewPointers(db).Update(ctx, def.Name, def.Collection, func(p *projection.Pointer) (bool, error) {
			p.Active, p.ActiveVersion = active, version
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(want string) {
		t.Helper()
		// A process of its own each time: the pointer as stored.
		p := mongodb.NewProjection(db, def, es, nil, mongodb.NewPointers(db))
		c, err := p.Check(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State != want {
			t.Errorf("check with the pointer at %q: state %q, want %q (%+v)", c.Collection, c.State, want, c)
		}
	}

	point("", 0)
	check("not-built")
	point(def.Collection, def.Ver()+1)
	check("other-version")
	point(def.Collection, def.Ver())
	check("missing")
	if _, _, err := mongodb.NewProjection(db, def, es, nil, mongodb.NewPointers(db)).Apply(ctx, f.Events[id], true); err != nil {
		t.Fatal(err)
	}
	check("equal")
}
