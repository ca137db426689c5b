package projection

import (
	"maps"
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
	days := map[string]DaySales{}
	for _, g := range gs {
		s := DaySales{Orders: g.Orders, Items: g.ItemCount, GrossCents: g.SubtotalCents, FreightCents: g.FreightCents}
		switch g.Status {
		case domain.StatusCanceled:
			s.Canceled = g.Orders
		case domain.StatusUnavailable:
			s.Unavailable = g.Orders
		}
		d := days[g.Day+"|"+g.Currency]
		d.add(s)
		days[g.Day+"|"+g.Currency] = d
	}
	return salesRows(days)
}

// salesRows returns days, keyed "<day>|<currency>" (YYYY-MM-DD, so the
// keys sort by day then currency), as one domain.DailySales row each,
// sorted by day then currency; none gives an empty slice.
func salesRows(days map[string]DaySales) []domain.DailySales {
	out := make([]domain.DailySales, 0, len(days))
	for _, k := range slices.Sorted(maps.Keys(days)) {
		s := days[k]
		out = append(out, domain.DailySales{Day: k[:len(time.DateOnly)], Currency: k[len(time.DateOnly)+1:], OrdersPlaced: s.Orders,
			Items: s.Items, GrossCents: s.GrossCents, FreightCents: s.FreightCents, OrdersCanceled: s.Canceled, OrdersUnavailable: s.Unavailable})
	}
	return out
}
