// Package olist imports the Olist sample (testdata/olist-sample) into a
// running orderd service as REST commands, then checks that every order's
// event-log fold equals its read model and ends in the status the dataset
// says, and that the daily sales read model equals the sums of the folds.
// Main is the command line, "orderd import-olist" ("orderd replay" is the
// same command: flags -data, -url, -concurrency, -check-only, -progress,
// -timeout, -limit); Run is the same for tests. It is no
// replay of the event log: that is the republish job (POST
// /v1/admin/replays).
//
// # Data
//
// Only olist_orders_dataset.csv and olist_order_items_dataset.csv are read;
// columns are found by their header names. Timestamps like
// "2017-10-02 10:56:33" are local Brazil time in the dataset but carry no
// zone: they are read as UTC, and sent as UTC ("2017-10-02T10:56:33Z"). An
// empty timestamp means the step did not happen. Prices and freight are BRL
// with two decimals ("58.90") and are parsed to integer cents by string
// parsing (ParseCents, no floats); a malformed amount, timestamp, status or
// id fails the load with an error naming the file and line.
//
// # From a dataset row to commands
//
// Each order becomes a plan: the commands below, in lifecycle order, each
// at the time the dataset gives (Olist's times are not always monotone; the
// service keeps what it is told).
//
//	place             at order_purchase_timestamp; customer_id from the
//	                  orders file, currency BRL, order_id = Olist order id
//	approve           at order_approved_at, when present
//	invoice           final status invoiced: at the approval time (the
//	                  dataset has no invoice time)
//	process           final status processing: at the approval time (no
//	                  processing time either)
//	ship              at order_delivered_carrier_date, when present
//	deliver           at order_delivered_customer_date, when present; without
//	                  "at" when the final status is delivered but the date is
//	                  missing (the service stamps its receive time)
//	cancel            final status canceled, after whatever steps have dates,
//	                  at the latest timestamp of the order (there is no
//	                  cancel time), reason "olist: canceled"
//	mark-unavailable  final status unavailable, at the approval time, or the
//	                  purchase time without one, reason "olist: unavailable"
//
// Where invoice or process needs the approval time and there is none, the
// purchase time is used (the command is refused anyway, see below).
//
// Order lines: when the items file has rows for the order, the rows (in
// order_item_id order) are grouped by product_id: sku = product_id,
// quantity = number of rows, unit_price_cents = price, and the line's
// freight_cents = the sum of its rows' freight_value (freight is per item
// in the data, so it goes on the line; the request has no order-level
// freight_cents). Rows of one product with different prices stay separate
// lines. The items file is an independent sample and covers few orders, so
// for any other order ONE row is chosen deterministically: row
// FNV-1a-64(order id) mod (number of item rows) of the items file, giving
// one line of quantity 1 with that row's product, price and freight
// (ChooseLine).
//
// Every command carries the header Idempotency-Key:
// olist-<order_id>-<command>, so a second run appends nothing and gets the
// same answers.
//
// # Odd paths
//
// The real data has paths the lifecycle refuses or that need a decision
// (domain package doc). The tool names them, counts them and expects
// exactly these refusals:
//
//	approval-missing         invoice, process, ship or deliver without an
//	                         approval time: each such step is refused
//	                         (409 invalid-transition) and the order stays
//	                         created, or ends canceled/unavailable when its
//	                         last command is cancel/mark-unavailable (legal
//	                         from created)
//	canceled-after-delivery  canceled with a delivery date: the cancel is
//	                         refused, the order ends delivered
//	canceled-after-carrier   canceled with a carrier date and no delivery:
//	                         shipped -> canceled is legal, nothing is refused
//	delivered-without-date   delivered with no delivery date: deliver is sent
//	                         without "at" and accepted
//
// Any other rejection is unexpected: the order's remaining commands are
// then skipped (they would only fail for the same cause) and counted.
//
// # Sending and checking
//
// Orders start in purchase-time order (then by id); -limit N keeps the
// first N. Each order's commands run sequentially in one worker, with
// -concurrency workers. A request is retried (4 attempts, backoff from
// 50 ms doubling) on network errors and 5xx answers; -timeout bounds each
// attempt. Each answer is accepted (2xx) or rejected with a reason
// "<command>: <last path segment of the problem type>", for example
// "ship: invalid-transition" ("http-<code>" when the answer is no problem
// document, "unreachable" when no answer came, "undecodable" when a 2xx
// answer is not the JSON of the route).
//
// The check (also the only step with -check-only) reads GET /v1/orders/{id}
// and GET /v1/order-summaries/{id}?min_version=<its version> for every
// order. Both must be equal as JSON values, the read model must not be
// stale (X-Read-Model-Stale), and the status must be the one the plan
// expects (the dataset's, or the documented refusal's). Then the
// daily sales (GET /v1/daily-sales, one request: at most ten years) must
// equal the sums of those folds per UTC day of placement and currency,
// over the days from the first order's to the last's; after -limit the
// last day is left out (a larger import may have placed more orders on
// it), and the service must hold no other orders placed on those days.
// A read model that differs is read again until the catch-up bound. Main
// prints the Report and returns an error when there is any mismatch or
// unexpected rejection.
package olist
