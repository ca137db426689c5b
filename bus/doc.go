// Package bus is the NATS JetStream side of the pipeline: the stream the
// outbox relay publishes committed events to and projectors consume from
// (StreamConfig, EnsureStream), the message of an event (its JSON on the
// subject <prefix>.<stream id>, Nats-Msg-Id = event id), and the Publisher
// that sends commits' events and waits for JetStream's acks.
//
// Invariant 3 (every committed event reaches NATS at least once) is kept
// with the outbox: a commit counts as published only once JetStream has
// acknowledged every one of its events, and Nats-Msg-Id lets the server
// drop the copies that a republish sends within the stream's
// de-duplication window.
package bus
