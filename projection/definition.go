package projection

import (
	"fmt"

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

// Key names what belongs to one version of the projection: its consumers
// and the prefix of its rebuilt collections. Version 1
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
	// customer_id serves a customer's list and stats, placed_at (with
	// currency) the daily sales of a range of purchase days.
	Indexes: [][]string{{"customer_id", "_id"}, {"status", "_id"}, {"placed_at", "currency"}},
}

// Retired names the projections earlier versions of the service ran and
// this one does not: customer_order_stats stored a subset of the order's
// summary per order, which the readers now sum from order_summaries
// through its customer_id index. An upgraded store retires what it left
// (its collections after the rebuild grace, its consumers once no process
// of it is alive). daily_sales is a rollup now (DailySales), whose version
// 2 replaces the per-order version 1 like any new version.
var Retired = []string{"customer_order_stats"}

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
