// Package eventstore is the MongoDB event log: commits appended under
// optimistic concurrency, streams loaded and scanned, and the outbox
// marker of each commit. The leases instances take turns under are the
// MongoDB adapter's (package mongodb).
//
// The log is the "events" collection, one document per commit:
//
//	{_id: "<stream id>:<first version>", stream_id, stream_type, first_version, last_version,
//	 events: [{event_id, type, version, occurred_at, recorded_at, data,
//	           correlation_id, causation_id, schema_version}],
//	 recorded_at, published: false, published_at, idempotency_key, request_hash}
//
// Invariant 1 (atomic, conditional append): a command's events are one
// document, so they are stored together or not at all, whatever happens
// to the process. Concurrent appends are group-committed (see Store): one
// unordered insert of several commit documents, each of which MongoDB
// writes atomically and judges alone against the unique indexes. A unique index on (stream_id, first_version) turns every
// race into a duplicate key: the writer sets first_version to the expected
// version + 1, which collides with the commit that followed that version if
// the stream moved on. Callers pass a version the stream has had (the head
// they loaded or cached); the store does not read the head itself, which is
// what lets a cached head skip the read.
//
// Invariant 2 (immutable events): nothing updates or deletes a commit
// except the outbox marker (published, published_at).
//
// Invariant 7 (retry-safe commands): the idempotency key is stored in the
// commit under a unique index on (stream_id, idempotency_key), partial
// over the commits that have a key, so the append and its idempotency
// record are one write. A key is unique within its stream, not across the
// log: every unique index starts with stream_id, so the collection can be
// sharded by stream_id. The domain sends every retry of a request to the
// stream of the first one (a place-order without an order id gets its id
// from the key), where the key collides.
//
// Invariant 3 (every committed event reaches NATS at least once): the
// commit's published=false is the outbox. Pending reads it and
// MarkPublished marks what JetStream acknowledged, for the relay of
// package outbox, which also hears of each append through an AppendHook.
//
// Scans (rebuild, verify) read the log in log order, stream by stream: on
// MongoDB one query sorted by _id, a walk of the _id index that holds one
// batch of commits; on FerretDB, which sorts whole documents in memory, a
// pass over the commit ids (at most 2^20 held, about 50 MiB, per pass)
// followed by _id look-ups (see ScanMethod).
//
// Durability: every role connects with ClientOptions (w:majority, j:true,
// readConcern majority, a server selection long enough for an election),
// so nothing a failover can roll back is answered, published or folded;
// Reachability answers requests at once while every member is down.
//
// No multi-document transaction, change stream or TTL index is used, and
// one partial index, the key index, whose filter {idempotency_key:
// {$exists: true}} the embedded store's funnel can drop without changing
// its meaning there; so the package behaves the same on MongoDB 6+ and
// FerretDB 1.24 (DESIGN.md §8). The conformance suite in storetest proves
// it on any MONGODB_URI.
package eventstore
