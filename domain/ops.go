package domain

import (
	"encoding/json"
	"errors"
)

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

// ReadModelCheck is one read model's document of one order stream beside
// the fold of the stream's log, as GET /v1/admin/orders/{id}/read-models
// shows it. State is "equal", or the verify job's kind of drift:
// "missing" (the log has the stream, the read model no document),
// "stale" (the document is at a lower version), "different" (same or
// higher version, some field differs) or "extra" (no such stream in the
// log). Document and Expected are JSON objects with the read model's
// field names, null when absent; Fields lists the top-level fields in
// which they differ. FoldError is the error of the first event the fold
// could not apply (Expected then reflects the events before it).
type ReadModelCheck struct {
	Projection    string          `json:"projection"`
	Collection    string          `json:"collection"`
	State         string          `json:"state"`
	StoredVersion int64           `json:"stored_version"`
	LogVersion    int64           `json:"log_version"`
	Document      json.RawMessage `json:"document"`
	Expected      json.RawMessage `json:"expected"`
	Fields        []string        `json:"fields,omitempty"`
	FoldError     string          `json:"fold_error,omitempty"`
}
