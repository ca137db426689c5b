package projection

import (
	"context"
	"encoding/json"
	"fmt"
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

// Check compares one stream's document in the active collection with a
// fresh fold of the stream's log, as a verify job's recheck does, and
// changes nothing. The document is read before the log, so a live write
// in between cannot make it look ahead of the log. A stream that neither
// the log nor the read model knows is reported "equal" with both sides
// null. A projection not built yet is reported "not-built", and one whose
// readers read another version than this process folds (a rolling
// upgrade) "other-version": neither is compared. Errors: the store's
// (domain.ErrUnavailable) and the log's.
func (p *Model[D]) Check(ctx context.Context, id string) (ReadModelCheck, error) {
	c := ReadModelCheck{Projection: p.def.Name, Document: json.RawMessage("null"), Expected: json.RawMessage("null")}
	ptr, err := p.pointers.Last(ctx, p.def.Name, p.def.Collection, readerPointerAge)
	if err != nil {
		return c, err
	}
	c.Collection = ptr.Active
	switch {
	case ptr.Active == "":
		c.State = "not-built"
		return c, nil
	case ptr.ActiveVer() != p.def.Ver():
		c.State = "other-version"
		return c, nil
	}
	docs, err := p.store.Load(ctx, ptr.Active, []string{id})
	if err != nil {
		return c, fmt.Errorf("check %s %s: %w", ptr.Active, id, err)
	}
	stored, exists := docs[id]
	evs, err := p.log.LoadFrom(ctx, id, 1)
	if err != nil {
		return c, fmt.Errorf("check %s %s: %w", ptr.Active, id, err)
	}
	want, n, ferr := p.def.Fold(evs)
	if ferr != nil {
		c.FoldError = ferr.Error()
	}
	if exists {
		c.StoredVersion = p.def.StreamVersion(&stored)
		if c.Document, err = json.Marshal(stored); err != nil {
			return c, fmt.Errorf("check %s %s: %w", ptr.Active, id, err)
		}
	}
	if n > 0 {
		c.LogVersion = p.def.StreamVersion(&want)
		if c.Expected, err = json.Marshal(want); err != nil {
			return c, fmt.Errorf("check %s %s: %w", ptr.Active, id, err)
		}
	}
	switch {
	case n == 0 && !exists:
		c.State = "equal"
	case n == 0:
		c.State = "extra"
	case !exists:
		c.State = "missing"
	case c.StoredVersion < c.LogVersion:
		c.State, c.Fields = "stale", DiffFields(stored, want)
	default:
		c.Fields = DiffFields(stored, want)
		c.State = "equal"
		if len(c.Fields) > 0 {
			c.State = "different"
		}
	}
	return c, nil
}
