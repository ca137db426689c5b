// Package mongodb is the MongoDB adapter: the event log (EventStore) with
// the client options every role connects with, the read models' storage
// (Documents, NewProjection, Rollups, Pointers, Reader), the leases instances take
// turns under (the relay, the jobs' tasks), the job store, the
// projections' dead letters, and the translation of the driver's errors.
// It speaks the domain's types and errors (and package projection's
// definitions, for the read models); the workers (outbox, projector,
// jobs) use it through small interfaces of their own.
//
// # Event log
//
// EventStore implements domain.EventStore: commits appended under
// optimistic concurrency, streams loaded and scanned, and the log tailed
// for the relay.
//
// The log is the "events" collection, one document per commit:
//
//	{_id: "<stream id>:<first version>", stream_id, stream_type, first_version, last_version,
//	 events: [{event_id, type, version, occurred_at, recorded_at, data,
//	           correlation_id, causation_id, schema_version}],
//	 recorded_at, idempotency_key, request_hash}
//
// Invariant 1 (atomic, conditional append): a command's events are one
// document, so they are stored together or not at all, whatever happens
// to the process. Concurrent appends are group-committed (see EventStore): one
// unordered insert of several commit documents, each of which MongoDB
// writes atomically and judges alone against the unique indexes. A unique index on (stream_id, first_version) turns every
// race into a duplicate key: the writer sets first_version to the expected
// version + 1, which collides with the commit that followed that version if
// the stream moved on. Callers pass a version the stream has had (the head
// they loaded or cached); the store does not read the head itself, which is
// what lets a cached head skip the read.
//
// Invariant 2 (immutable commits): nothing updates or deletes a commit
// after its insert; the log is insert-only. (Commits that earlier versions
// appended also hold their outbox marker, published and published_at,
// which this version only reads in OldestUnpublished.)
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
// Invariant 3 (every committed event reaches NATS at least once): the log
// is the outbox. Tail follows its change stream (read concern majority),
// for the relay of package outbox, which saves the stream's positions as
// checkpoints; RecordedSince reads it by recorded time (an index on
// recorded_at), for the relay's catch-up when the stream cannot resume
// (ChangeStreamHistoryLost: domain.ErrHistoryLost).
//
// Scans (rebuild, verify) read the log in log order, stream by stream: on
// MongoDB one query sorted by _id, a walk of the _id index that holds one
// batch of commits; on FerretDB, which sorts whole documents in memory, a
// pass over the commit ids (at most 2^20 held, about 50 MiB, per pass)
// followed by _id look-ups (see Scan).
//
// Durability: every role connects with ClientOptions (w:majority, j:true,
// readConcern majority, a server selection long enough for an election),
// so nothing a failover can roll back is answered, published or folded;
// Reachability answers requests at once while every member is down.
//
// No multi-document transaction or TTL index is used, one change stream
// (of the log's inserts, which the embedded store's funnel serves), and
// one partial index, the key index, whose filter {idempotency_key:
// {$exists: true}} the funnel can drop without changing its meaning
// there; so the package behaves the same on MongoDB 6+ and FerretDB 1.24.
// The conformance suites (storetest: the event store and the change
// stream) prove it on any MONGODB_URI.
//
// # Read models
//
// The read models are the projections' documents (package projection
// defines them and holds the fold, the loop over a delivery, the
// rebuild's writes and verify: projection.Model). This package stores
// them: Documents (projection.Store) loads documents by _id, saves a
// batch in one unordered bulk write, and reads a collection whole for a
// verify; Pointers keeps each projection's pointer document; Reader
// answers the HTTP API's queries on the active collection.
//
// Racing and late writers: every save is a compare-and-set on the
// document's version, a replacement with upsert filtered on {_id, version:
// {$lt: v}}; a duplicate key means a newer version is already stored. A
// write that lands late (a second writer while a partition's pin moves,
// one the driver retried across an election) therefore never moves a
// document back, and writers racing in any number of processes cannot
// lose an update (invariant 4). On the embedded store the write funnel
// serves the guard by _id at index speed (package internal/embedded).
//
// Every write of a pointer is a compare-and-set on its generation, so a
// job that stalled past its lease cannot undo a newer rebuild's
// announcement or switch (invariant 5). People and outside tools find the
// live collection in the pointer document (projection_pointers).
//
// # Leases, jobs and dead letters
//
// Invariant 6 (one job, one runner): Leases is the one lease
// implementation. A lease is one document; a claim is one conditional
// update whose filter includes the value it changes (a deadline in the
// past, or this holder's name), so of any number of claimants exactly one
// matches. Every claim raises the lease's epoch, the fencing token
// (lease.Lease.Epoch): renewals, releases and fenced writes match only
// {_id, owner, epoch} of the claim making them, so a deposed holder's
// are refused with domain.ErrLeaseLost and its late writes change
// nothing. A holder that stops renewing loses the lease after its TTL;
// Release hands it over at once. Two sets of leases use it:
//
//   - Lease: one named lease of the "leases" collection, for a loop that
//     claims and renews it (the relay's, "outbox-relay"), with the
//     relay's checkpoint kept in the lease's document and written fenced
//     by the claim (Lease.SaveCheckpoint).
//   - the jobs' tasks in "projection_job_tasks" (Jobs.Claim), claimed at
//     the epoch they were read at, with every checkpoint fenced by the
//     claim.
//
// Jobs is the job store: the operator's jobs in "projection_jobs", their
// tasks beside them, and one rebuild lock per projection in
// "projection_locks", taken by an insert so that one of concurrent
// requests gets it. DeadLetters is the "dead_letters" collection: the
// events a projection could not apply, parked with their error, listed
// and retried. Their documents are the adapter's own types (jobDoc,
// taskDoc, deadLetterDoc), converted from and to the domain's at each
// call: their bson tags are the collections' field names, which the
// filters and updates here name too, so the domain keeps no storage tags.
// A job's verify report and a task's resumes, which no filter names, are
// stored under their JSON names, as read-model documents are
// (document_test.go pins the stored shape).
//
// Durability: lease and job writes are w:majority, j:true whatever the
// client's defaults, so no claim a failover can roll back is acted on.
// Each operation is one document write or one updateMany, which MongoDB
// applies atomically per document and the embedded store's funnel runs
// alone, so the leases behave the same on MongoDB 6+ and on FerretDB
// 1.24; the conformance suite (lease_test.go) proves it on any
// MONGODB_URI.
//
// Errors: Translate turns a driver error into the domain's vocabulary at
// the boundary: a network error, a failed server selection, an exhausted
// pool or a server error that passes (a failover, a shutdown, a time
// limit) wraps domain.ErrUnavailable; the caller's own cancellation and
// deadline, and other server errors, are returned as they are.
package mongodb
