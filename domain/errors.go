package domain

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors: the error vocabulary of the service. Adapters translate
// driver errors into these at their boundary; the HTTP layer maps them to
// status codes in one table. Match them with errors.Is.
var (
	// ErrNotFound: the stream or read-model document does not exist.
	ErrNotFound = errors.New("not found")
	// ErrVersionConflict: an append lost an optimistic-concurrency race (the
	// stream is no longer at the expected version).
	ErrVersionConflict = errors.New("version conflict")
	// ErrPreconditionFailed: the client's If-Match version is not the
	// stream's current version.
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrInvalidTransition: the command is not legal in the order's status.
	ErrInvalidTransition = errors.New("invalid transition")
	// ErrValidation: the command or its data is malformed.
	ErrValidation = errors.New("validation failed")
	// ErrAlreadyExists: an order with this id exists with other content.
	ErrAlreadyExists = errors.New("already exists")
	// ErrDuplicateRequest: the idempotency key is already stored in a commit.
	// Returned by EventStore.Append; the Service turns it into a replay of
	// the first result or ErrIdempotencyKeyReused.
	ErrDuplicateRequest = errors.New("duplicate request")
	// ErrIdempotencyKeyReused: the idempotency key was first used for a
	// different request.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused for another request")
	// ErrUnavailable: a dependency (store, bus) cannot be reached.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnknownEvent: an event type or schema version this build cannot decode.
	ErrUnknownEvent = errors.New("unknown event type")
	// ErrUnreadableCommit: the event log holds a commit this build cannot
	// read: an event of a type or schema version it does not know (a
	// newer writer, during a rolling deploy), a payload or document that
	// does not decode, or a commit that does not continue its stream's
	// versions. Reading it again gives the same error: readers treat the
	// stream as poison rather than as an unavailable store. The event
	// store wraps it together with the cause (ErrUnknownEvent,
	// ErrValidation).
	ErrUnreadableCommit = errors.New("unreadable commit")
	// ErrHistoryLost: the log's change stream cannot resume from the
	// position asked for: the store no longer holds the history after it
	// (it fell off MongoDB's oplog), or it names a collection that was
	// dropped and created again. The reader catches up from the log
	// itself instead (package outbox).
	ErrHistoryLost = errors.New("change stream history lost")
	// ErrLeaseLost: a lease's holder was deposed (its lease expired and
	// another holder claimed it, or it released it), so its renewal,
	// release or fenced write was refused.
	ErrLeaseLost = errors.New("lease lost")
)

// The errors of the operator's requests: the repair jobs (rebuild,
// verify, replay) of the read models, which package jobs runs, and the
// dead letters, which package projector parks.
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

// FieldError is one rejected field of a command: Field is the JSON path
// (for example "items[2].quantity"), Detail says what is wrong.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// ValidationError lists every rejected field. errors.Is(err, ErrValidation)
// holds for it.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Detail
	}
	return fmt.Sprintf("%s: %s", ErrValidation, strings.Join(parts, "; "))
}

// Is makes errors.Is(err, ErrValidation) true.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// add records a field error; it keeps the zero value usable.
func (e *ValidationError) add(field, format string, args ...any) {
	e.Fields = append(e.Fields, FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

// err returns nil when no field was rejected.
func (e *ValidationError) err() error {
	if len(e.Fields) == 0 {
		return nil
	}
	return e
}
