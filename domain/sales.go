package domain

// DailySales is one row of the daily sales (GET /v1/daily-sales): the orders placed
// on one day (the UTC date of their OrderPlaced's OccurredAt) in one
// currency. GrossCents is the sum of their subtotals (unit price times
// quantity of every line) and FreightCents the sum of their freight, both
// in minor units of Currency; OrdersCanceled and OrdersUnavailable count
// those of them whose current status is canceled or unavailable (their
// amounts stay in the gross and freight).
type DailySales struct {
	Day               string `json:"day"` // YYYY-MM-DD
	Currency          string `json:"currency"`
	OrdersPlaced      int64  `json:"orders_placed"`
	Items             int64  `json:"items"`
	GrossCents        int64  `json:"gross_cents"`
	FreightCents      int64  `json:"freight_cents"`
	OrdersCanceled    int64  `json:"orders_canceled"`
	OrdersUnavailable int64  `json:"orders_unavailable"`
}
