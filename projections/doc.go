// Package projections feeds the read models of package projection from
// NATS JetStream: a Runner per projection consumes its events, split into
// partitions by stream id, each consumed by one process at a time under a
// lease and shared evenly by the live projector processes (Axon's
// tracking-processor segments, Kafka's consumer groups).
//
// Invariant 4 (idempotent, order-tolerant) is kept by package
// projection's version guard, which makes any redelivery harmless; this
// side acknowledges a message only after its document is written.
//
// Poison events (not decodable, not applicable, or in a stream whose gap
// the log cannot fill: a commit this build cannot read,
// domain.ErrUnreadableCommit) are redelivered with backoff and parked in
// the dead_letters collection after MaxDeliveries, so one bad event
// stalls only its own stream; only a store that cannot be reached is
// retried without limit. DeadLetters lists them and Runner.Retry
// re-applies one.
package projections
