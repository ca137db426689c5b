package projection

import "encoding/json"

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
