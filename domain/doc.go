// Package domain is the order aggregate and the vocabulary every adapter
// speaks: events, commands, the fold, the command Service, and the sentinel
// errors. It imports only the standard library (checked by make lint).
//
// # Lifecycle
//
// An order follows the Olist lifecycle. Each command appends one event;
// Decide refuses a command whose event is not in this table with
// ErrInvalidTransition, and Apply refuses to fold such an event.
//
//	command            event                    legal from                                  to
//	place              OrderPlaced              (new stream)                                created
//	approve            OrderApproved            created                                     approved
//	invoice            OrderInvoiced            approved                                    invoiced
//	process            OrderProcessingStarted   approved, invoiced                          processing
//	ship               OrderShipped             approved, invoiced, processing              shipped
//	deliver            OrderDelivered           shipped                                     delivered
//	cancel             OrderCanceled            created, approved, invoiced, processing,    canceled
//	                                            shipped
//	mark-unavailable   OrderMarkedUnavailable   created, approved, invoiced, processing     unavailable
//
// delivered, canceled and unavailable are terminal. The odd paths of the
// real Olist data are decided on purpose:
//
//   - Invoicing and processing are optional: Olist records a hand-over to
//     the carrier for orders it never marked invoiced or processing, so ship
//     is legal straight from approved.
//   - Approval is not optional: an order is never shipped, delivered or
//     invoiced before its payment is approved. An Olist order with no
//     approval time but a carrier date is refused at ship and stays created.
//   - A cancel after hand-over to the carrier is legal (the parcel is
//     recalled or refused in transit): shipped -> canceled.
//   - A cancel after delivery is refused: delivered is terminal, a return is
//     a different process. The Olist order that is both delivered and
//     canceled ends delivered.
//   - A delivered order with no delivery date is delivered at the time the
//     service receives the command, like any command without a time.
//
// Commands do not check that their times are later than the previous step:
// the real data has carrier dates after delivery dates, and the log keeps
// what it was told.
//
// # Events
//
// Events carry an id, the stream id and type, a 1-based contiguous version,
// OccurredAt (the business time), RecordedAt (the commit time), typed Data
// and Metadata (correlation id, causation id = command id, schema version).
// Times are UTC with millisecond precision (Timestamp). MarshalEvent and
// UnmarshalEvent are the JSON wire form; DecodeData runs the upcasters for
// older schema versions. A schema version belongs to an event type
// (CurrentSchema): OrderPlaced is at 2, which gave lines their own freight,
// every other type at 1; EventTypes lists the types, and
// testdata/old-events holds stored events of every schema of each, which
// the tests read back (docs/events.md). Money is int64 minor units with an
// ISO 4217 currency, never a float; an order's freight is its order-level
// freight plus its lines'.
//
// # Commands
//
// Service.Execute is the command path: fold (or take the cached state),
// Decide, EventStore.Append with the expected version. It keeps invariant 7
// (an Idempotency-Key's retry returns the first result and appends
// nothing; a key is unique per order, and a PlaceOrder without an order id
// gets KeyedOrderID of its key, so its retries reach the same order), invariant 8 (bad input returns an error before anything is
// appended) and retries lost version races with jittered backoff unless
// the client's If-Match names versions (IfMatch).
//
// # Log reads
//
// ScanRange and StreamEvents describe a read of the log in log order, and
// RecordedCommit a commit as the store recorded it (the event store
// produces them; the relay, the read models' rebuild and verify, and the
// log browser consume them). The operator's nouns are the packages' that
// produce them: jobs, their tasks, reports and the projections' status
// are package jobs'; leases, members, partitions and dead letters package
// projector's; the pointer document and read-model checks package
// projection's; the relay's status package outbox's; the log browser's
// pages and the history package admin's. Their errors (ErrJobRunning,
// ErrLeaseLost, ...) stay here, with the API's error vocabulary.
package domain
