// Package mongodb is the MongoDB adapter: the leases instances take turns
// under (the relay's sweep, the projections' partitions, the jobs'
// tasks), the projector members' heartbeats, the job store, the
// projections' dead letters, and the translation of the driver's errors. It speaks the domain's types and errors; the workers
// (outbox, projector, jobs) use it through small interfaces of their own.
//
// Invariant 6 (one job, one runner): Leases is the one lease
// implementation. A lease is one document; a claim is one conditional
// update whose filter includes the value it changes (a deadline in the
// past, or this holder's name), so of any number of claimants exactly one
// matches. Every claim raises the lease's epoch, the fencing token
// (domain.Lease.Epoch): renewals, releases and fenced writes match only
// {_id, owner, epoch} of the tenure making them, so a deposed holder's
// are refused with domain.ErrLeaseLost and its late writes change
// nothing. A holder that stops renewing loses the lease after its TTL;
// Release hands it over at once. Three sets of leases use it:
//
//   - Lease: one named lease of the "leases" collection, for a loop that
//     claims and renews it (the relay's sweeper, "relay").
//   - Partitions: a projection's partitions in "projection_partitions",
//     renewed all at once in one updateMany; Members are the heartbeats
//     of the processes that share them, in "projection_members".
//   - Tasks: the jobs' tasks in "projection_job_tasks", claimed at the
//     epoch they were read at, with every checkpoint fenced by the claim.
//
// Jobs is the job store: the operator's jobs in "projection_jobs", their
// tasks beside them, and one rebuild lock per projection in
// "projection_locks", taken by an insert so that one of concurrent
// requests gets it. DeadLetters is the "dead_letters" collection: the
// events a projection could not apply, parked with their error, listed
// and retried. Their documents are the adapter's own types (jobDoc,
// taskDoc, deadLetterDoc), converted from and to the domain's at each
// call: their bson tags are the collections' field names, which the
// filters and updates here name too, so the domain keeps no storage tags
// (document_test.go pins the stored shape).
//
// Durability (DESIGN.md §8): lease and job writes are w:majority, j:true
// whatever the client's defaults, so no claim a failover can roll back is acted on.
// No transaction, change stream or TTL index is used: each operation is
// one document write or one updateMany, which MongoDB applies atomically
// per document and the embedded store's funnel runs alone, so the leases
// behave the same on MongoDB 6+ and on FerretDB 1.24; the conformance
// suite (lease_test.go) proves it on any MONGODB_URI.
//
// Errors: Translate turns a driver error into the domain's vocabulary at
// the boundary: a network error, a failed server selection, an exhausted
// pool or a server error that passes (a failover, a shutdown, a time
// limit) wraps domain.ErrUnavailable; the caller's own cancellation and
// deadline, and other server errors, are returned as they are.
package mongodb
