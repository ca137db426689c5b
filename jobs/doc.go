// Package jobs schedules and runs the operator's jobs on the read models
// (rebuild, verify and replay) across any number of instances.
//
// Jobs creates a job and splits it into tasks, stored in
// projection_job_tasks beside the job's document in projection_jobs,
// through Store (the MongoDB adapter's *mongodb.Jobs);
// Workers in any number of instances claim the tasks and run them, and
// Jobs.Get sums their progress. What a task does to a read model is
// package projection's (projection.Model's WriteFolds, VerifySums and
// Verify) and the pointer documents'; this package decides who runs it,
// when, and from where:
//
//   - Invariant 5: a rebuild announces a shadow collection in the
//     projection's pointer; live projectors then also write the shadow.
//     The rebuild's plan cuts the log into partitions; each partition
//     scans the log in log order, inserts each stream's fold into the
//     shadow and records its sum (projection.SumsCollection); its finish
//     verifies the shadow against those sums with repair, rechecking
//     against the log each document that differs or has none (against
//     the whole log when a partition was scanned without sums), and
//     switches the pointer; the sums are dropped then, and the replaced
//     collection after a grace period. Readers never see the shadow before
//     the switch. One rebuild per projection runs at a time (the rebuild lock
//     in projection_locks).
//   - Invariant 6: a task is claimed by one update filtered on its epoch
//     and an expired lease (claim-by-filter: exactly one of any number of
//     workers matches); the owner renews the lease and checkpoints under a
//     filter on its epoch, and a task whose lease ran out is resumed by
//     another worker from its cursor (see claim). The tasks' leases are
//     kept through TaskLeases, part of the job Store.
//
// A verify job compares a projection's active collection with the fold of
// the log and, when asked, repairs the documents that differ; a replay job
// publishes part of the log to NATS again, each event under its event id
// as Nats-Msg-Id. A job is canceled at its tasks' next checkpoint; a
// rebuild that has recorded the collection its switch replaces can no
// longer be canceled.
package jobs
