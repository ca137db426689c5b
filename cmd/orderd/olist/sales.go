package olist

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/pause"
)

// salesPoll is how long the daily sales check waits between two reads of
// a read model that is still behind.
const salesPoll = 250 * time.Millisecond

// SalesCheck is the check of the daily sales: the days From to
// To (YYYY-MM-DD, both included) and Rows, the day and currency rows the
// log folds give for them; Mismatches lists the rows that differ in the
// read model. Skipped says why the check did not run ("" when it did).
type SalesCheck struct {
	From, To   string
	Rows       int
	Mismatches []string
	Skipped    string
}

// salesOf sums the log folds of orders (each with a placement) per UTC day
// of placement and currency, as GET /v1/daily-sales does: orders, items,
// subtotals, freight, and those now canceled or unavailable; sorted by
// day, then currency. It is the check's own sum, written apart from the
// service's (projection.SumSales), so that the check can catch an error
// in that one too.
func salesOf(folds []domain.Order) []domain.DailySales {
	rows := map[string]domain.DailySales{}
	for _, o := range folds {
		day := o.PlacedAt.UTC().Format(time.DateOnly)
		k := day + " " + o.Currency
		r := rows[k]
		r.Day, r.Currency = day, o.Currency
		r.OrdersPlaced++
		r.Items += o.ItemCount
		r.GrossCents += o.SubtotalCents
		r.FreightCents += o.FreightCents
		switch o.Status {
		case domain.StatusCanceled:
			r.OrdersCanceled++
		case domain.StatusUnavailable:
			r.OrdersUnavailable++
		}
		rows[k] = r
	}
	out := make([]domain.DailySales, 0, len(rows))
	for _, k := range slices.Sorted(maps.Keys(rows)) {
		out = append(out, rows[k])
	}
	return out
}

// checkSales compares GET /v1/daily-sales with the daily sales of the log
// folds of every order checked (salesOf). The service must hold no other
// orders placed on those
// days; when partial (the import stopped at -limit) the last day is left
// out, as orders of it may have been imported before. A read model that
// differs is read again until the check's catch-up bound.
func (r *importer) checkSales(ctx context.Context, checks []checked, partial bool) SalesCheck {
	var sc SalesCheck
	unread := 0
	folds := make([]domain.Order, 0, len(checks))
	for _, ch := range checks {
		if ch.fold.PlacedAt == nil {
			unread++
			continue
		}
		folds = append(folds, ch.fold)
	}
	if unread > 0 {
		sc.Skipped = fmt.Sprintf("%d orders' log folds could not be read", unread)
		return sc
	}
	want := salesOf(folds)
	if len(want) == 0 {
		sc.Skipped = "no orders"
		return sc
	}
	sc.From, sc.To = want[0].Day, want[len(want)-1].Day
	if partial {
		last := sc.To
		want = slices.DeleteFunc(want, func(r domain.DailySales) bool { return r.Day == last })
		if len(want) == 0 {
			sc.Skipped = "no whole day imported (-limit)"
			return sc
		}
		sc.To = want[len(want)-1].Day
	}
	sc.Rows = len(want)
	// One request: Olist's orders span three years, within the
	// orderhttp.MaxSalesYears the route answers (a longer range is
	// refused, and so reported as a mismatch).
	first, _ := time.Parse(time.DateOnly, sc.From) // salesOf made both
	last, _ := time.Parse(time.DateOnly, sc.To)
	for {
		var got orderhttp.DailySalesReport
		err := r.retry(ctx, func(ctx context.Context) (err error) {
			got, err = r.api.DailySales(ctx, first, last, "")
			return err
		})
		if err != nil {
			sc.Mismatches = []string{fmt.Sprintf("daily sales %s to %s: %v", sc.From, sc.To, err)}
		} else {
			sc.Mismatches = diffSales(want, got.Days)
		}
		if len(sc.Mismatches) == 0 || !time.Now().Before(r.catchUp) {
			return sc
		}
		pause.For(ctx, salesPoll)
		if ctx.Err() != nil {
			return sc
		}
	}
}

// diffSales names the rows, "<day> <currency>", where the read model got
// differs from the log folds want, with the fields that differ: want's
// rows in their order (day, then currency), then the rows only the read
// model has, sorted.
func diffSales(want, got []domain.DailySales) []string {
	model := map[string]domain.DailySales{}
	for _, g := range got {
		model[g.Day+" "+g.Currency] = g
	}
	var out []string
	for _, w := range want {
		k := w.Day + " " + w.Currency
		g, ok := model[k]
		delete(model, k)
		switch {
		case !ok:
			out = append(out, k+": not in the read model")
		case w != g:
			out = append(out, k+": "+diff(document(w), document(g)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(model)) {
		out = append(out, k+": in the read model, not in the log")
	}
	return out
}

// line is the report's line about the daily sales check.
func (sc SalesCheck) line() string {
	switch {
	case sc.Skipped != "":
		return "not checked: " + sc.Skipped
	case len(sc.Mismatches) == 0:
		return fmt.Sprintf("%s to %s, %d day and currency rows: equal to the log folds", sc.From, sc.To, sc.Rows)
	}
	return fmt.Sprintf("%s to %s, %d day and currency rows: mismatches %d", sc.From, sc.To, sc.Rows, len(sc.Mismatches))
}
