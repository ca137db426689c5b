package projection

import (
	"cmp"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
)

// StatsGroup is what a customer's stats add up from a group of their
// orders of one status and currency: how many (Orders), the sum of their
// TotalCents, and the newest RecordedAt among them (zero when none
// carries one). A store that cannot group sends one StatsGroup per order,
// with Orders 1.
type StatsGroup struct {
	Status     domain.Status
	Currency   string
	Orders     int64
	TotalCents int64
	RecordedAt time.Time
}

// SumStats adds up a customer's groups into their stats: every order is
// counted, by status, and the totals of those whose status counts toward
// the lifetime value (domain.CountsTowardValue) are summed per currency.
func SumStats(customerID string, gs []StatsGroup) domain.CustomerOrderStats {
	s := domain.CustomerOrderStats{CustomerID: customerID, ByStatus: map[domain.Status]int64{}, LifetimeValueCents: map[string]int64{}}
	for _, g := range gs {
		s.OrderCount += g.Orders
		s.ByStatus[g.Status] += g.Orders
		if domain.CountsTowardValue(g.Status) {
			s.LifetimeValueCents[g.Currency] += g.TotalCents
		}
		if g.RecordedAt.After(s.RecordedAt) {
			s.RecordedAt = g.RecordedAt
		}
	}
	return s
}

// SalesGroup is what the daily sales add up from a group of orders placed
// on one Day (SaleDay of their placed_at) in one currency, all now of one
// status: how many (Orders), and the sums of their item counts, subtotals
// and freight. A store that cannot group sends one SalesGroup per order,
// with Orders 1.
type SalesGroup struct {
	Day           string
	Currency      string
	Status        domain.Status
	Orders        int64
	ItemCount     int64
	SubtotalCents int64
	FreightCents  int64
}

// SaleDay is the purchase day of an order placed at t: its UTC date,
// YYYY-MM-DD.
func SaleDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// SumSales adds up groups into one domain.DailySales row per day and
// currency, sorted by day then currency; nothing gives an empty slice.
func SumSales(gs []SalesGroup) []domain.DailySales {
	type key struct{ day, currency string }
	rows := map[key]*domain.DailySales{}
	for _, g := range gs {
		k := key{g.Day, g.Currency}
		r, ok := rows[k]
		if !ok {
			r = &domain.DailySales{Day: g.Day, Currency: g.Currency}
			rows[k] = r
		}
		r.OrdersPlaced += g.Orders
		r.Items += g.ItemCount
		r.GrossCents += g.SubtotalCents
		r.FreightCents += g.FreightCents
		switch g.Status {
		case domain.StatusCanceled:
			r.OrdersCanceled += g.Orders
		case domain.StatusUnavailable:
			r.OrdersUnavailable += g.Orders
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
