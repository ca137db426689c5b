// Package projector feeds the read models from NATS JetStream: a Runner
// per projection consumes the projection's events, split into partitions
// by stream id, and writes each batch through the projection's Apply
// (Projection: a projection.Model over the MongoDB adapter). Each partition
// has a durable pull consumer with a pinned priority group: JetStream
// delivers it to one pulling process at a time and moves it to another
// once that one stops pulling; the processes running a projection answer
// each other's roll calls (RollCall) and share the partitions evenly
// (Runner.balance). A Runner also reports its partitions and consumer lag
// (PartitionStatus, Lag) and keeps the events it could not apply in the
// dead-letter collection (DeadLetterStore, the MongoDB adapter's
// *mongodb.DeadLetters).
//
// Invariant 4 (idempotent, order-tolerant): the read models' version
// guard skips what a document already reflects and fills gaps from the
// log, so any redelivery, and a second process writing a partition while
// its pin moves, is harmless; this side acknowledges a message only after
// its document reflects it.
//
// During a rebuild the pointer names a shadow collection, and
// Projection.Apply writes every batch to it before the active one: live
// projectors need do nothing more to keep the shadow from falling behind
// (invariant 5).
//
// Poison events (not decodable, not applicable, or in a stream whose gap
// the log cannot fill: a commit this build cannot read,
// domain.ErrUnreadableCommit) are redelivered with backoff and parked in
// the dead_letters collection after MaxDeliveries, so one bad event
// stalls only its own stream; the events of the stream up to the version
// its document reached are acknowledged. Only a store that cannot be
// reached is retried without limit. The dead-letter store lists them and
// Runner.Retry re-applies one.
//
// The package names no storage: it declares what it needs of it
// (Projection, DeadLetterStore) and cmd/orderd passes the MongoDB
// adapter's implementations.
package projector
