package domain

import "time"

// ScanRange selects streams of the event log in log order, for a full scan
// or one partition of it (see mongodb.EventStore.Scan). Log order is stream
// by stream, each stream's events in version order, streams ordered by
// their id followed by ":" (which differs from plain id order only when one
// id is a prefix of another). Zero fields do not limit.
type ScanRange struct {
	From  string // first stream of the range (a partition bound)
	To    string // first stream after the range (a partition bound)
	After string // last stream already done: resume after it
	// RecordedFrom and RecordedTo keep only commits recorded in
	// [RecordedFrom, RecordedTo).
	RecordedFrom, RecordedTo time.Time
}

// StreamEvents is one stream's events in a scanned range, in version order.
// Err is set when one of its commits cannot be decoded (it wraps
// ErrUnreadableCommit); Events then holds the events before that commit.
type StreamEvents struct {
	StreamID string
	Events   []Event
	Commits  int // commits read
	Err      error
}

// RecordedCommit is a commit as the log holds it, as the outbox publishes
// it: its id in the log, its stream, the version of its first event and
// the correlation id of its command, when it was recorded, its events in
// version order as messages of the bus, and how many events it holds
// (Count, also when they cannot be read). Err is set, and Events empty,
// when the stored commit cannot be read or holds an event type or schema
// version this build does not know (it wraps ErrUnreadableCommit).
type RecordedCommit struct {
	ID            string
	StreamID      string
	FirstVersion  int64
	CorrelationID string
	RecordedAt    time.Time
	Events        []EventMessage
	Count         int
	Err           error
}

// EventMessage is an event as the bus carries it: its id, and its JSON
// wire form (MarshalEvent), which UnmarshalEvent reads.
type EventMessage struct {
	ID   string
	Body []byte
}
