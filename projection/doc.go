// Package projection keeps the read models: documents folded from the
// event log, one per order stream, written so that any delivery of the
// events (late, twice, out of order, by racing processes) leaves them equal
// to the fold of the log, and read by the HTTP API.
//
// Two projections exist, both one document per order stream:
// order_summaries (a domain.Order, the same fold as the aggregate) and
// customer_order_stats (each order's Contribution to its customer's stats,
// summed on read). A Definition says how to fold a document; a ReadModel
// writes one collection of it; a Projection is a read model as the service
// runs it: its pointer to the active collection (Pointers) and a ReadModel
// per collection in use; a Reader answers queries. Package projector feeds
// the projections from NATS JetStream through Projection.Apply, and
// package jobs rebuilds and verifies them.
//
// Invariant 4 (idempotent, order-tolerant): every document carries the
// stream version it reflects. An event at or below it is skipped; an event
// beyond version+1 means a gap, and the missing events are read from the
// log. Events that cannot be applied (not applicable to the document, or
// in a stream whose gap the log cannot fill: a commit this build cannot
// read, domain.ErrUnreadableCommit) are reported per stream as a
// PoisonError, with the version the document reached despite them; the
// other streams of the batch are written.
//
// Racing and late writers: every write is a compare-and-set on the
// document's version, a replacement with upsert filtered on {_id, version:
// {$lt: v}}; a duplicate key means a newer version is already stored. A
// write that lands late (a deposed partition owner's, one the driver
// retried across an election) therefore never moves a document back, and
// writers racing in any number of processes cannot lose an update. A batch
// is one unordered bulk write. On the embedded store the write funnel
// serves the guard by _id at index speed (package internal/embedded).
//
// Repair path. Each projection has a pointer document naming its active
// collection (Pointers, Projection); readers follow it. Every write of it
// is a compare-and-set on its generation, so a job that stalled past its
// lease cannot undo a newer rebuild's announcement or switch. While the
// pointer names a shadow collection (a rebuild under way),
// Projection.Apply writes every batch to the shadow first and the active
// collection second, so the switch never shows a reader an older version
// (invariant 5). A rebuild fills the shadow with Projection.WriteFolds,
// whose inserts meet the documents live projectors wrote through the
// version guard. Verify folds every stream and compares it with the read
// model, reporting missing, stale, extra and different documents with
// AdHash digests; with repair it rewrites only those. Package jobs
// schedules rebuilds and verifies and runs them.
package projection
