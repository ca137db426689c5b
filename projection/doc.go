// Package projection says what the read models are, independently of how
// they are stored: documents folded from the event log, one per order
// stream, which any delivery of the events (late, twice, out of order, by
// racing processes) must leave equal to the fold of the log.
//
// Three projections exist, all one document per order stream:
// order_summaries (a domain.Order, the same fold as the aggregate),
// customer_order_stats (each order's Contribution to its customer's stats,
// summed on read by SumContributions) and daily_sales (each order's Sale,
// summed on read per purchase day and currency by SumSales). A Definition says how to fold a
// document and which version it reflects, and Definition.Fold folds a
// stream from nothing. A verify compares read models with the fold by
// DocHash (the SHA-256 of a document's JSON), sums them into a Digest
// (AdHash, independent of order) and names what differs with DiffFields.
// An Outcome counts what applying a batch did; a PoisonError is a stream
// whose events cannot be applied, with the version its document reached
// despite them; Metrics are the projections' Prometheus metrics.
//
// The package imports no storage. The read models' storage (the guarded
// writes, pointers, rebuild writes, verify and the query-side reader) is
// the MongoDB adapter's (package mongodb); package projector feeds the
// projections from NATS JetStream and package jobs rebuilds and verifies
// them.
package projection
