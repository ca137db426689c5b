// Package outbox is the relay from the event log to the message bus
// (invariant 3: every committed event reaches NATS at least once).
//
// A commit's published=false in the log is the outbox. Each API
// instance's Relay hears of its own appends through the event store's
// append hook (wired in main), publishes them at once with Nats-Msg-Id =
// event id, and marks them once JetStream acknowledged every event; no
// lease is needed, since the server drops a second copy. What an instance
// leaves unpublished (a crash, a full queue, NATS down) is published by
// the Sweeper: one instance at a time, under the "relay" Lease (invariant
// 6), sweeps the commits still unpublished after a grace period.
//
// The package knows neither MongoDB nor NATS: it works on three small
// interfaces, Commits (the log's outbox reads and markers,
// *mongodb.EventStore), Publisher (*bus.Publisher, or tracing.Publisher
// around it) and Lease (*mongodb.Lease).
package outbox
