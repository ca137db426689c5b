// Package outbox is the relay from the event log to the message bus
// (invariant 3: every committed event reaches NATS at least once).
//
// The log is the outbox, and it is insert-only (invariant 2: a commit
// never changes after its insert). One Relay at a time, under the
// RelayLease (invariant 6), tails the log's change stream and publishes
// each commit's events in commit order with Nats-Msg-Id = event id; once
// JetStream has acknowledged a round it saves the stream's position after
// it, with the recorded time of its last commit, as its checkpoint beside
// the lease, fenced by the lease's epoch. A crash resumes from the
// checkpoint, and the copies it publishes again are dropped by
// JetStream's de-duplication and the projections' version guards. When
// the stream cannot resume (the store lost the history after the
// checkpoint), the relay catches up from the log by recorded time and
// tails on: nothing is skipped, and the catch-up is logged at ERROR and
// counted.
//
// The package knows neither MongoDB nor NATS: it works on three small
// interfaces, Log (the log's change stream and its reads by recorded
// time, *mongodb.EventStore), Publisher (*bus.Publisher, or
// tracing.Publisher around it) and Lease (*mongodb.Lease, which keeps the
// checkpoint).
package outbox
