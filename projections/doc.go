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
// log; every write is a compare-and-set on the version read, so two
// workers racing on one order cannot lose an update: the loser re-reads and
// re-folds. Messages are acknowledged only after their document is written.
//
// Writes use an ordered bulkWrite of upserting replaceOne models filtered
// on {_id, version}. A lost compare-and-set shows as a duplicate key error
// (the upsert's insert collides on _id). FerretDB stops a bulk at its first
// error and reports it at the wrong index with no counts, so after any
// failed bulk the Store re-reads every document of the round and redoes the
// ones still behind, and never trusts a failed bulk's result (DESIGN.md §8).
//
// Poison events (not decodable or not applicable) are redelivered with
// backoff and parked in the dead_letters collection after MaxDeliveries,
// so one bad event stalls only its own stream; DeadLetters lists them and
// Runner.Retry re-applies one.
package projections
