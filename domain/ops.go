package domain

import "errors"

// The errors of the operator's requests: the repair jobs (rebuild,
// verify, replay) of the read models, which package jobs runs, and the
// dead letters, which package projector parks.

// Errors of job and dead-letter requests.
var (
	// ErrJobRunning: a rebuild of the projection is already running.
	ErrJobRunning = errors.New("a rebuild of this projection is already running")
	// ErrJobFinished: the job has already finished.
	ErrJobFinished = errors.New("the job has already finished")
	// ErrRetryFailed: a retried dead letter still cannot be applied.
	ErrRetryFailed = errors.New("dead letter still fails")
	// ErrNotBuilt: no version of the read model has been built from the
	// log yet (a projection new to the service); it is being built.
	ErrNotBuilt = errors.New("read model not built yet")
	// ErrOtherVersion: the request needs the projection's definition at
	// the version the store is at, and this instance folds another (a
	// rolling upgrade is under way).
	ErrOtherVersion = errors.New("the store holds another version of this projection")
	// ErrNoPrevious: there is no previous collection to switch back to
	// (none was replaced, or its grace has passed).
	ErrNoPrevious = errors.New("no previous version to switch back to")
	// ErrPointerMoved: a projection's pointer document is no longer the
	// one a write was decided on. Either a compare-and-set on its
	// generation lost to a newer write (re-read it and decide again), or
	// the collection a job works on is no longer named by it (a rebuild
	// replaced it, and it is to be dropped).
	ErrPointerMoved = errors.New("projection pointer moved")
)
