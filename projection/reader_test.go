package projection_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projection/projectiontest"
)

// TestReaderListSummaries: filters by customer and status, and cursor
// pagination with limit 3 that returns every matching summary exactly once,
// in order id order.
func TestReaderListSummaries(t *testing.T) {
	ctx, db, es := projectiontest.Start(t, 60*time.Second)
	f := projectiontest.NewFixture(t, ctx, es, "lst", 14, 3)
	s := projection.NewReadModel(db, projection.OrderSummaries, es, nil)
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	// Insert out of id order, so id order is the query's doing.
	if _, poison, err := s.Apply(ctx, reversed(f.Flat)); err != nil || len(poison) > 0 {
		t.Fatalf("Apply: poison %v, err %v", poison, err)
	}
	r := projection.NewReader(db, projection.NewPointers(db))

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
			for _, id := range f.IDs { // ids are in id order
				o := f.Orders[id]
				if (tc.customer == "" || o.CustomerID == tc.customer) && (tc.status == "" || string(o.Status) == tc.status) {
					want = append(want, o)
				}
			}
			if tc.customer == "" && tc.status == "" && len(want) != len(f.IDs) {
				t.Fatalf("want %d, fixture has %d", len(want), len(f.IDs))
			}
			var got []domain.Order
			after := ""
			for page := 0; ; page++ {
				if page > len(f.IDs) {
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
	if p, err := r.ListSummaries(ctx, "", "", f.IDs[len(f.IDs)-1], limit); err != nil || len(p) != 0 {
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

// TestReadModelsCountLineFreight: both read models fold an order whose
// lines carry their own freight into totals that include it, and an order
// placed before lines had freight (schema 1, freight on the order) into
// the totals it always had.
func TestReadModelsCountLineFreight(t *testing.T) {
	ctx, db, es := projectiontest.Start(t, 60*time.Second)
	at := time.Date(2018, 1, 2, 3, 4, 5, 0, time.UTC)
	lines := domain.OrderPlaced{CustomerID: "cust-f", Currency: "BRL", Items: []domain.Line{
		{SKU: "sku-a", Quantity: 2, UnitPriceCents: 5890, FreightCents: 1579},
		{SKU: "sku-b", Quantity: 1, UnitPriceCents: 2999, FreightCents: 872},
	}}
	old := domain.OrderPlaced{CustomerID: "cust-f", Currency: "BRL", FreightCents: 1500,
		Items: []domain.Line{{SKU: "sku-c", Quantity: 1, UnitPriceCents: 4990}}}
	oldEvent := projectiontest.NewEvent("f-old", 1, old, at)
	oldEvent.Metadata.SchemaVersion = 1 // as written before lines had freight
	var events []domain.Event
	for _, e := range []domain.Event{projectiontest.NewEvent("f-lines", 1, lines, at), oldEvent} {
		if _, err := es.Append(ctx, domain.Commit{StreamID: e.StreamID, StreamType: e.StreamType, Events: []domain.Event{e}}); err != nil {
			t.Fatal(err)
		}
		evs, err := es.LoadFrom(ctx, e.StreamID, 1)
		if err != nil || len(evs) != 1 {
			t.Fatalf("load %s: %v, %v", e.StreamID, evs, err)
		}
		events = append(events, evs...)
	}
	if v := events[1].Metadata.SchemaVersion; v != 1 {
		t.Fatalf("the old-shape order was stored at schema %d, want 1", v)
	}
	for _, s := range []interface {
		Apply(context.Context, []domain.Event) (projection.Outcome, map[string]error, error)
	}{
		projection.NewReadModel(db, projection.OrderSummaries, es, nil),
		projection.NewReadModel(db, projection.CustomerOrderStats, es, nil),
	} {
		if _, poison, err := s.Apply(ctx, events); err != nil || len(poison) > 0 {
			t.Fatalf("Apply: poison %v, err %v", poison, err)
		}
	}

	r := projection.NewReader(db, projection.NewPointers(db))
	want := map[string]struct{ freight, total int64 }{
		"f-lines": {1579 + 872, 2*5890 + 2999 + 1579 + 872},
		"f-old":   {1500, 4990 + 1500},
	}
	for id, w := range want {
		o, err := r.Summary(ctx, id)
		if err != nil {
			t.Fatalf("summary %s: %v", id, err)
		}
		if o.FreightCents != w.freight || o.TotalCents != w.total {
			t.Errorf("summary %s: freight %d, total %d; want %d, %d", id, o.FreightCents, o.TotalCents, w.freight, w.total)
		}
	}
	if o, _ := r.Summary(ctx, "f-lines"); !reflect.DeepEqual(o.Items, lines.Items) {
		t.Errorf("summary items %+v, want %+v", o.Items, lines.Items)
	}
	stats, err := r.CustomerStats(ctx, "cust-f")
	if err != nil {
		t.Fatal(err)
	}
	if v := stats.LifetimeValueCents["BRL"]; v != want["f-lines"].total+want["f-old"].total {
		t.Errorf("lifetime value %d, want %d", v, want["f-lines"].total+want["f-old"].total)
	}
}
