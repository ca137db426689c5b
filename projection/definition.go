package projection

import (
	"fmt"
	"time"

	"github.com/orderd/orderd/domain"
)

// Definition describes a projection whose read model holds one document
// per stream, folded from that stream's events: Apply folds the next event
// into it, and on error (the event cannot be applied: a poison event) must
// leave the document unchanged; StreamVersion is the stream version the
// document reflects. D is stored with its JSON field names and must have a
// top-level "version" field equal to StreamVersion.
//
// Version is the definition's own version (0 counts as 1). Its author
// bumps it whenever Apply or the document's shape changes: a service
// whose store has not built that version builds it from the log beside
// the version readers read, verifies it and only then switches readers
// to it (see jobs.Worker), the way Marten's ProjectionVersion keeps the
// versions apart (martendb.io, "Projection Versioning"), with the switch
// made and checked by the service. Each version has its own collections
// and consumers (Key), so binaries of two versions running side by side
// during a rolling upgrade each feed only the collections of theirs.
type Definition[D any] struct {
	Name          string
	Collection    string
	Version       int
	Apply         func(doc *D, e domain.Event) error
	StreamVersion func(doc *D) int64
	// Indexes are extra single or compound ascending indexes, as field lists.
	Indexes [][]string
}

// Ver is the definition's version, at least 1.
func (d Definition[D]) Ver() int { return max(d.Version, 1) }

// Key names what belongs to one version of the projection: its consumers,
// partition leases and the prefix of its rebuilt collections. Version 1
// keeps the projection's Name, so stores and streams from before
// versioning keep theirs; version n > 1 is "<name>_v<n>".
func (d Definition[D]) Key() string { return VersionKey(d.Name, d.Ver()) }

// VersionKey is Definition.Key of version v of projection name.
func VersionKey(name string, v int) string {
	if v <= 1 {
		return name
	}
	return fmt.Sprintf("%s_v%d", name, v)
}

// OrderSummaries is the order_summaries projection: one domain.Order per
// order, folded with domain.Order.Apply, the same fold as the aggregate, so
// a caught-up summary equals GET /v1/orders/{id}.
var OrderSummaries = Definition[domain.Order]{
	Name:       "order_summaries",
	Collection: "order_summaries",
	// 2: documents carry recorded_at, for the freshness headers.
	Version:       2,
	Apply:         func(o *domain.Order, e domain.Event) error { return o.Apply(e) },
	StreamVersion: func(o *domain.Order) int64 { return o.Version },
	Indexes:       [][]string{{"customer_id", "_id"}, {"status", "_id"}},
}

// Contribution is one order's share of its customer's stats: the fields of
// the order that the stats add up, the version they reflect and the
// RecordedAt of that version's event (zero in documents written before
// the field existed).
type Contribution struct {
	OrderID    string        `json:"order_id"`
	CustomerID string        `json:"customer_id"`
	Status     domain.Status `json:"status"`
	Currency   string        `json:"currency"`
	TotalCents int64         `json:"total_cents"`
	Version    int64         `json:"version"`
	RecordedAt time.Time     `json:"recorded_at,omitzero"`
	// Orders is how many orders a sum of contributions stands for (see
	// SumContributions); never stored.
	Orders int64 `json:"-"`
}

// CustomerOrderStats is the customer_order_stats projection. It stores one
// Contribution per order (not one document per customer): lifecycle events
// do not name the customer, so a per-customer document could not be found
// without the order's own state, and per-order documents make every write
// the same version-guarded compare-and-set as order_summaries. Reader sums
// a customer's contributions on read, through an index on customer_id.
var CustomerOrderStats = Definition[Contribution]{
	Name:       "customer_order_stats",
	Collection: "customer_order_stats",
	// 2: contributions carry recorded_at, for the freshness headers.
	Version: 2,
	Apply: func(c *Contribution, e domain.Event) error {
		// Fold through domain.Order so the transition rules are the
		// aggregate's own.
		o := domain.Order{ID: c.OrderID, CustomerID: c.CustomerID, Status: c.Status, Currency: c.Currency,
			TotalCents: c.TotalCents, Version: c.Version}
		if err := o.Apply(e); err != nil {
			return err
		}
		*c = Contribution{OrderID: o.ID, CustomerID: o.CustomerID, Status: o.Status, Currency: o.Currency,
			TotalCents: o.TotalCents, Version: o.Version, RecordedAt: o.RecordedAt}
		return nil
	},
	StreamVersion: func(c *Contribution) int64 { return c.Version },
	Indexes:       [][]string{{"customer_id"}},
}

// SumContributions adds up a customer's contributions; one with Orders
// set stands for that many orders of its status and currency, with
// TotalCents their sum. The stats' RecordedAt is the newest of the
// contributions'.
func SumContributions(customerID string, cs []Contribution) domain.CustomerOrderStats {
	s := domain.CustomerOrderStats{CustomerID: customerID, ByStatus: map[domain.Status]int64{}, LifetimeValueCents: map[string]int64{}}
	for _, c := range cs {
		n := max(c.Orders, 1)
		s.OrderCount += n
		s.ByStatus[c.Status] += n
		if domain.CountsTowardValue(c.Status) {
			s.LifetimeValueCents[c.Currency] += c.TotalCents
		}
		if c.RecordedAt.After(s.RecordedAt) {
			s.RecordedAt = c.RecordedAt
		}
	}
	return s
}

// Fold folds a stream's events from nothing. It returns the document, the
// number of events applied and the error of the first event that could
// not be applied (the document then reflects the events before it, as the
// live projection leaves it).
func (d Definition[D]) Fold(evs []domain.Event) (D, int, error) {
	var doc D
	for i, e := range evs {
		if err := d.Apply(&doc, e); err != nil {
			return doc, i, fmt.Errorf("apply %s v%d of %s: %w", e.Type, e.Version, e.StreamID, err)
		}
	}
	return doc, len(evs), nil
}
