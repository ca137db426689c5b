// Package mongodb is the MongoDB adapter: the MongoDB code of the service
// that is not the event log's or the read models' lives here, and it speaks
// the domain's types and errors to the packages that use it.
//
// Errors: Translate turns a driver error into the domain's vocabulary at
// the boundary: a network error, a failed server selection, an exhausted
// pool or a server error that passes (a failover, a shutdown, a time
// limit) wraps domain.ErrUnavailable; the caller's own cancellation and
// deadline, and other server errors, are returned as they are.
package mongodb
