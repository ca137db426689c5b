// Package operator holds the operator's subcommands of orderd that talk to
// the admin API of a running service through the project's HTTP client
// (orderhttp.Client): "orderd status" (each projection's active
// collection, lag, dead letters, partitions, last verify and rebuild),
// "orderd rebuild" (start, follow or cancel a rebuild of a read model)
// and "orderd verify" (compare a read model with the event log, optionally
// repair it).
//
// Each subcommand is a function of its arguments, the environment
// (getenv), stdout and stderr, so tests run it without a process. The
// admin token is read from the environment only (ADMIN_TOKEN), never from
// a flag: flags show in ps.
package operator
