package projections_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/storetest"
	"github.com/orderd/orderd/projections"
)

// TestReaderListSummaries: filters by customer and status, and cursor
// pagination with limit 3 that returns every matching summary exactly once,
// in order id order.
func TestReaderListSummaries(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	db := storetest.Database(t)
	es := newLog(t, ctx, db)
	f := newFixture(t, ctx, es, "lst", 14, 3)
	s := projections.NewStore(db, projections.OrderSummaries, es, nil)
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	// Insert out of id order, so id order is the query's doing.
	if _, poison, err := s.Apply(ctx, reversed(f.flat)); err != nil || len(poison) > 0 {
		t.Fatalf("Apply: poison %v, err %v", poison, err)
	}
	r := projections.NewReader(db, projections.NewPointers(db))

	const limit = 3
	cases := []struct{ customer, status string }{
		{"", ""},
		{"cust-1", ""},
		{"", string(domain.StatusDelivered)},
		{"", string(domain.StatusCreated)},
		{"cust-0", string(domain.StatusCanceled)},
		{"cust-2", string(domain.StatusShipped)}, // matches nothing
		{"nobody", ""},
	}
	for _, tc := range cases {
		t.Run(tc.customer+"/"+tc.status, func(t *testing.T) {
			var want []domain.Order
			for _, id := range f.ids { // ids are in id order
				o := f.orders[id]
				if (tc.customer == "" || o.CustomerID == tc.customer) && (tc.status == "" || string(o.Status) == tc.status) {
					want = append(want, o)
				}
			}
			if tc.customer == "" && tc.status == "" && len(want) != len(f.ids) {
				t.Fatalf("want %d, fixture has %d", len(want), len(f.ids))
			}
			var got []domain.Order
			after := ""
			for page := 0; ; page++ {
				if page > len(f.ids) {
					t.Fatalf("more than %d pages: the cursor does not advance", page)
				}
				p, err := r.ListSummaries(ctx, tc.customer, tc.status, after, limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(p) > limit {
					t.Fatalf("page %d after %q: %d summaries, limit %d", page, after, len(p), limit)
				}
				got = append(got, p...)
				if len(p) < limit {
					break
				}
				after = p[len(p)-1].ID
			}
			if !slices.IsSortedFunc(got, func(a, b domain.Order) int { return strings.Compare(a.ID, b.ID) }) {
				t.Errorf("not in id order: %v", ids(got))
			}
			if len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
				t.Errorf("listed %v, want %v", ids(got), ids(want))
			}
		})
	}

	// A cursor past the last id is an empty page, not an error.
	if p, err := r.ListSummaries(ctx, "", "", f.ids[len(f.ids)-1], limit); err != nil || len(p) != 0 {
		t.Errorf("page after the last id: %v (%v), want empty", ids(p), err)
	}
}

func ids(os []domain.Order) []string {
	out := make([]string, len(os))
	for i, o := range os {
		out[i] = o.ID
	}
	return out
}
