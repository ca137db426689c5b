// Package projections keeps the read models: documents derived from the
// event log, fed by NATS JetStream, queried by the HTTP API.
//
// Two projections exist, both one document per order stream:
// order_summaries (a domain.Order, the same fold as the aggregate) and
// customer_order_stats (each order's Contribution to its customer's stats,
// summed on read). A Definition says how to fold a document; a Store writes
// one read model; a Runner feeds a Store from a durable pull consumer; a
// Reader answers queries.
//
// Invariant 4 (idempotent, order-tolerant): every document carries the
// stream version it reflects. An event at or below it is skipped; an event
// beyond version+1 means a gap, and the missing events are read from the
// log. Messages are acknowledged only after their document is written.
//
// Racing writers: FerretDB 1.24 on SQLite answers every filter other than
// {_id: value} by decoding the whole collection, so a compare-and-set on
// {_id, version} would cost a collection scan per write. Writes are
// instead guarded by a version register in the document itself: one
// findOneAndUpdate by _id sets the folded fields and $max-es "attempted";
// the writer that finds attempted above what it wrote folds again from the
// log and rewrites. The last write therefore always leaves the highest
// version any writer attempted, so two workers racing on one order cannot
// lose an update (see Store and its race test). The trade-offs: during such
// a race a reader may briefly see an older version; and the guard needs
// atomic single-document updates, which MongoDB has and FerretDB 1.24 has
// not (it reads, then writes, with no transaction), so on the embedded
// store only the workers of one process are safe: they take turns per
// stream.

// Poison events (not decodable or not applicable) are redelivered with
// backoff and parked in the dead_letters collection after MaxDeliveries,
// so one bad event stalls only its own stream; DeadLetters lists them and
// Runner.Retry re-applies one.
package projections
