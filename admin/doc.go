// Package admin is the admin side of the REST API (orderhttp.Admin): it
// starts and cancels the operator's repair jobs (rebuild, verify, replay;
// package jobs runs them), reports each projection's state with its
// partitions' owners and lag (package projector), lists and retries dead
// letters, and compares one order's read-model documents with the fold of
// its log.
//
// It holds no state of its own: jobs, leases, pointers and dead letters
// live in the store, so any instance with the api role answers the same.
// A malformed job id, or a dead letter of an unknown projection, is
// domain.ErrNotFound before any query.
package admin
