// Package loadgen drives many orders through their lifecycle over the REST
// API of one or more running orderd instances, with a configurable share of
// conflicting concurrent commands, and records every acknowledged command
// so that a caller can check afterwards that each one's event is in the
// event log exactly once. Main is the command line (orderd loadgen); Run is
// the same for tests.
//
// # What one order does
//
// Order n (1..Config.Orders) has the id "<RunID>-<n>", n zero-padded to the
// width of Orders ("k3f9a2c1-007"). It is placed (POST /v1/orders, currency
// BRL, customer "lg-cust-<k>", 1 to 3 lines of quantity 1 to 5, a freight),
// then walks the lifecycle one command at a time until a terminal status:
// at each step the next command is drawn among those the domain's state
// machine allows in the order's current status (asked of
// domain.Next, not a copy of the table), weighted towards the happy
// path approve, invoice, process, ship, deliver, with cancel possible from
// every status before delivered. mark-unavailable is not sent. Each command
// goes to a URL drawn at random among Config.URLs. Choices are seeded per
// order from Config.Seed, so a seed gives the same orders and paths
// whatever the concurrency, up to the first race: which side wins is up to
// the service, and the rest of the path follows the winner.
//
// # Races
//
// With probability Config.ConflictRate a lifecycle step (never the place)
// is sent as a race: two commands legal in the current status (the same
// command twice when only one is legal) are sent at the same time, to two
// different URLs when there are several, each with If-Match: "<version>"
// (the version of the order's last answer) and its own idempotency key.
// Optimistic concurrency promises that at most one wins; the loser is
// answered 412 precondition-failed (or 409). The order continues from the
// winner's answer. Both sides acknowledged is a double win (Report.DoubleWins),
// a broken promise.
//
// # Idempotency and retries
//
// Every command carries Idempotency-Key: "<order id>-<command>", with
// "-a" or "-b" appended for the two sides of a race, and X-Correlation-ID
// equal to the key, so each event in the log names the command that
// appended it (metadata.correlation_id). A transport error, a 5xx or a 429
// is retried with the same key and body, each retry to the next URL of
// Config.URLs (so a dead instance does not hold an order up), with backoff
// 50ms doubling up to 1s, for Config.RetryFor in all; the service answers
// a retry of a command that committed with its first result
// (Idempotent-Replayed: true), which counts as an acknowledgement. A command still without an answer after
// RetryFor, or when the context ends, has an unknown outcome: its key goes
// to Report.Unknown and its order is abandoned. net/http itself may resend
// a request once, uncounted, when a reused keep-alive connection fails
// before any answer (requests with an Idempotency-Key are replayable).
//
// # What is checked
//
// Each acknowledged command must answer the version that follows the
// order's previous answer (every command appends exactly one event) and
// the status the state machine leads to; a command that is not part of a
// race must not be refused. Anything else is listed in Report.Unexpected.
// Report.Acks lists every acknowledged command, order by order, so a
// caller can compare them with
// GET /v1/orders/{id}/events: one event per ack, with the ack's key as its
// correlation id, and the stream's version equal to the last ack's.
//
// # Safety
//
// Only loopback URLs (127.0.0.0/8, ::1, localhost) are accepted, and the
// HTTP client refuses to connect anywhere else (no proxy, no redirects, a
// dial-time check of the address). A run is bounded by Config.Orders and
// Config.Duration.
package loadgen
