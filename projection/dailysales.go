package projection

import (
	"cmp"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
)

// Sale is one order's share of its purchase day's sales: the fields of the
// order that daily_sales adds up, the version they reflect and when the
// newest event applied was recorded.
type Sale struct {
	OrderID       string        `json:"order_id"`
	Day           string        `json:"day"` // UTC date of the order's placement, YYYY-MM-DD
	Currency      string        `json:"currency"`
	Status        domain.Status `json:"status"`
	ItemCount     int64         `json:"item_count"`
	SubtotalCents int64         `json:"subtotal_cents"`
	FreightCents  int64         `json:"freight_cents"`
	Version       int64         `json:"version"`
	RecordedAt    time.Time     `json:"recorded_at"` // RecordedAt of the newest event applied
	// Orders is how many orders a sum of sales stands for (see SumSales);
	// never stored.
	Orders int64 `json:"-"`
}

// DailySales is the daily_sales projection. Like CustomerOrderStats it
// stores one document per order (a Sale), because lifecycle events carry
// neither the day nor the currency: every write is the same
// version-guarded compare-and-set as order_summaries, and the reader sums
// the sales of a range of days on read, through the index on (day,
// currency).
var DailySales = Definition[Sale]{
	Name:       "daily_sales",
	Collection: "daily_sales",
	Apply: func(s *Sale, e domain.Event) error {
		// Fold through domain.Order so the transition rules are the
		// aggregate's own.
		o := domain.Order{ID: s.OrderID, Status: s.Status, Currency: s.Currency, ItemCount: s.ItemCount,
			SubtotalCents: s.SubtotalCents, FreightCents: s.FreightCents, Version: s.Version}
		if err := o.Apply(e); err != nil {
			return err
		}
		day := s.Day
		if o.PlacedAt != nil {
			day = SaleDay(*o.PlacedAt)
		}
		*s = Sale{OrderID: o.ID, Day: day, Currency: o.Currency, Status: o.Status, ItemCount: o.ItemCount,
			SubtotalCents: o.SubtotalCents, FreightCents: o.FreightCents, Version: o.Version, RecordedAt: e.RecordedAt}
		return nil
	},
	StreamVersion: func(s *Sale) int64 { return s.Version },
	Indexes:       [][]string{{"day", "currency"}},
}

// SaleDay is the day of daily_sales that t falls on: its UTC date,
// YYYY-MM-DD.
func SaleDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// SumSales adds up sales into one domain.DailySales per day and currency,
// sorted by day then currency; a sale with Orders set stands for that
// many orders of its status, with ItemCount, SubtotalCents and
// FreightCents their sums.
func SumSales(sales []Sale) []domain.DailySales {
	type key struct{ day, currency string }
	rows := map[key]*domain.DailySales{}
	for _, s := range sales {
		k := key{s.Day, s.Currency}
		r, ok := rows[k]
		if !ok {
			r = &domain.DailySales{Day: s.Day, Currency: s.Currency}
			rows[k] = r
		}
		n := max(s.Orders, 1)
		r.OrdersPlaced += n
		r.Items += s.ItemCount
		r.GrossCents += s.SubtotalCents
		r.FreightCents += s.FreightCents
		switch s.Status {
		case domain.StatusCanceled:
			r.OrdersCanceled += n
		case domain.StatusUnavailable:
			r.OrdersUnavailable += n
		}
	}
	out := make([]domain.DailySales, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b domain.DailySales) int {
		return cmp.Or(cmp.Compare(a.Day, b.Day), cmp.Compare(a.Currency, b.Currency))
	})
	return out
}
