package http

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/http/api"
)

// MaxSalesYears is the longest range GET /v1/daily-sales answers: ten
// years of days, both ends included (a range reads a document per month
// and currency). A client asks for a longer range in parts.
const MaxSalesYears = 10

// DailySalesReport is the answer of GET /v1/daily-sales: the range asked
// for (YYYY-MM-DD, both included) and one row per day and currency that
// has orders, sorted by day then currency.
type DailySalesReport struct {
	From string              `json:"from"`
	To   string              `json:"to"`
	Days []domain.DailySales `json:"days"`
}

// GetDailySales answers GET /v1/daily-sales?from=YYYY-MM-DD&to=YYYY-MM-DD[&currency=XXX]
// from the daily_sales rollup (summed from the order summaries until it is
// built). from and to are required, to is not before from and the range
// is at most MaxSalesYears years; every invalid parameter is listed in
// the 422.
func (s operations) GetDailySales(c echo.Context, p api.GetDailySalesParams) error {
	currency := text(p.Currency)
	var fields []domain.FieldError
	date := func(name, v string) (time.Time, bool) {
		d, err := time.Parse(time.DateOnly, v)
		if err != nil || d.Format(time.DateOnly) != v {
			fields = append(fields, domain.FieldError{Field: name, Detail: "a date YYYY-MM-DD, required"})
			return time.Time{}, false
		}
		return d, true
	}
	from, fromOK := date("from", text(p.From))
	to, toOK := date("to", text(p.To))
	switch {
	case !fromOK || !toOK:
	case to.Before(from):
		fields = append(fields, domain.FieldError{Field: "to", Detail: "on or after from"})
	case !to.Before(from.AddDate(MaxSalesYears, 0, 0)):
		fields = append(fields, domain.FieldError{Field: "to", Detail: "less than ten years after from"})
	}
	if currency != "" && !domain.ValidCurrency(currency) {
		fields = append(fields, domain.FieldError{Field: "currency", Detail: "an ISO 4217 code: three upper-case letters"})
	}
	if len(fields) > 0 {
		return invalid(fields...)
	}
	days, answered, err := s.cfg.ReadModels.DailySales(c.Request().Context(), from, to, currency)
	if err != nil {
		return err
	}
	if days == nil {
		days = []domain.DailySales{}
	}
	s.freshness(c, answered, time.Time{})
	return c.JSON(http.StatusOK, DailySalesReport{From: from.Format(time.DateOnly), To: to.Format(time.DateOnly), Days: days})
}
