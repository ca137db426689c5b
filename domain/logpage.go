package domain

import (
	"encoding/json"
	"time"
)

// LogCommit is one commit of the log as the log browser shows it: its id
// ("<stream id>:<first version, 10 digits>"), stream, the versions it holds,
// when the store recorded it, and its events in version order. Error is
// set, and Events empty, when this build cannot decode the commit.
type LogCommit struct {
	ID           string    `json:"id"`
	StreamID     string    `json:"stream_id"`
	StreamType   string    `json:"stream_type"`
	FirstVersion int64     `json:"first_version"`
	LastVersion  int64     `json:"last_version"`
	RecordedAt   time.Time `json:"recorded_at"`
	Events       []Event   `json:"events"`
	Error        string    `json:"error,omitempty"`
}

// LogQuery selects one page of the log, newest commit first. Empty
// filters do not filter; Type and CorrelationID keep the commits with at
// least one event of that type or correlation id.
type LogQuery struct {
	Cursor        string // "" for the newest commits, else a LogPage's Next
	Limit         int    // commits per page, 1 to 200
	StreamID      string
	Type          string
	CorrelationID string
}

// LogPage is a page of the log, newest first. Next is the opaque cursor
// of the older commits, "" when none are left. A page holds Limit commits
// unless the log ends first, or a search by event type ran out of its time
// first: then DeadlineReached is set, and Next continues the search where
// it stopped (the page may hold no commit).
type LogPage struct {
	Commits         []LogCommit `json:"commits"`
	Next            string      `json:"next_cursor,omitempty"`
	DeadlineReached bool        `json:"deadline_reached,omitempty"`
}

// Matches reports whether c passes q's stream, type and correlation
// filters.
func (q LogQuery) Matches(c LogCommit) bool {
	typeOK, corrOK := q.Type == "", q.CorrelationID == ""
	for _, e := range c.Events {
		typeOK = typeOK || e.Type == q.Type
		corrOK = corrOK || e.Metadata.CorrelationID == q.CorrelationID
	}
	return typeOK && corrOK && (q.StreamID == "" || c.StreamID == q.StreamID)
}

// MarshalJSON writes the commit with each event in its wire form
// (MarshalEvent, with its data), as GET /v1/orders/{id}/events does.
func (c LogCommit) MarshalJSON() ([]byte, error) {
	type plain LogCommit
	evs := make([]json.RawMessage, len(c.Events))
	for i, e := range c.Events {
		b, err := MarshalEvent(e)
		if err != nil {
			return nil, err
		}
		evs[i] = b
	}
	return json.Marshal(struct {
		plain
		Events []json.RawMessage `json:"events"`
	}{plain(c), evs})
}
