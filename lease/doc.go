// Package lease is the one kind of lease the service holds: a named,
// time-limited claim of one holder at a time, fenced by an epoch that
// every claim raises (invariant 6: one job, one runner). The relay holds
// one to tail the log (package outbox) and the jobs hold one per task
// (package jobs); the MongoDB adapter keeps them (mongodb.Leases), each
// write a conditional update on the lease's document.
package lease
