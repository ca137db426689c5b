// Package http is the REST API (docs/api.md), server and client (imported
// as orderhttp): commands over POST, the order folded from the log, the read
// models, and health, readiness and Prometheus metrics.
//
// It keeps invariant 8: a body is decoded strictly (application/json, no
// unknown fields, no trailing data, a size limit) and validated, path ids
// are checked before any query, and every refusal is an RFC 9457 problem
// document with a stable type ("/problems/<slug>") and per-field details;
// nothing reaches the log unless the domain accepts it. Errors map to
// statuses in one table (codes); only 5xx are logged.
//
// Commands accept Idempotency-Key (invariant 7; a key belongs to the order
// it is used on, and a place without order_id gets domain.KeyedOrderID of
// its key as order id), If-Match as RFC 9110 §13.1.1 reads it ("*" or a
// list of entity tags, compared strongly: 412 when none matches, 422 when
// the value is neither) and X-Correlation-ID; they answer with
// ETag: "<version>". Every timestamp of an answer is written with
// milliseconds, three digits (encodeJSON). GET /v1/order-summaries/{id}?min_version=N
// waits, bounded, until the read model reflects version N: read-your-writes
// over an eventually consistent model.
//
// openapi.json is the API's one source: package api is generated from it,
// and NewServer registers the routes api.RegisterHandlers names, with their
// path and query parameters bound as the document declares them, on the
// handlers of this package (operations); the Client sends the requests
// api.Client builds.
//
// Client is the same API from the other side, for the project's tools:
// one method per route they use, each answer decoded into the domain's
// types, and every refusal an *Error carrying the problem document and
// wrapping the domain error the server's table maps to its type, so that
// a caller matches errors.Is(err, domain.ErrNotFound) on either side of
// the wire. Retries, timeouts and where connections may go are the
// caller's: the Client sends each request once over the *http.Client it
// is given.
package http
