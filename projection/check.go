package projection

import (
	"cmp"
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
// fresh fold of the stream's log, as a verify job's recheck does
// (compare), and changes nothing. A stream that neither
// the log nor the read model knows is reported "equal" with both sides
// null. A projection not built yet is reported "not-built", and one whose
// readers read another version than this process folds (a rolling
// upgrade) "other-version": neither is compared. Errors: the store's
// (domain.ErrUnavailable) and the log's.
func (p *Model[D]) Check(ctx context.Context, id string) (ReadModelCheck, error) {
	c := ReadModelCheck{Projection: p.def.Name, Document: json.RawMessage("null"), Expected: json.RawMessage("null")}
	ptr, err := p.pointers.Last(ctx, p.def.Name, p.def.Collection, ReaderPointerAge)
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
	d, err := p.compare(ctx, ptr.Active, id)
	if err == nil && d.exists {
		c.Document, err = json.Marshal(d.stored)
	}
	if err == nil && d.events > 0 {
		c.Expected, err = json.Marshal(d.want)
	}
	if err != nil {
		return c, fmt.Errorf("check %s %s: %w", ptr.Active, id, err)
	}
	c.State, c.StoredVersion, c.LogVersion, c.Fields = cmp.Or(d.Kind, "equal"), d.StoredVersion, d.LogVersion, d.Fields
	if d.foldErr != nil {
		c.FoldError = d.foldErr.Error()
	}
	return c, nil
}

// streamDrift is a document beside a fresh fold of its stream's log
// (Model.compare): DriftExample's Kind is "" when they are equal or
// neither exists.
type streamDrift[D any] struct {
	DriftExample
	stored, want D
	exists       bool
	events       int   // of the log folded into want
	foldErr      error // of the first event the fold could not apply
}

// compare reads document id of coll, then folds its stream's log afresh,
// and says how they differ, as a verify's recheck and Check report it.
// The document is read first: it only reflects events already in the
// log, so a live write in between cannot make it look ahead of the log.
// Errors: the store's and the log's.
func (p *Model[D]) compare(ctx context.Context, coll, id string) (streamDrift[D], error) {
	d := streamDrift[D]{DriftExample: DriftExample{ID: id}}
	docs, err := p.store.Load(ctx, coll, []string{id})
	if err != nil {
		return d, fmt.Errorf("read %s of %s: %w", id, coll, err)
	}
	d.stored, d.exists = docs[id]
	evs, err := p.log.LoadFrom(ctx, id, 1)
	if err != nil {
		return d, err
	}
	d.want, d.events, d.foldErr = p.def.Fold(evs)
	d.StoredVersion, d.LogVersion = p.def.StreamVersion(&d.stored), p.def.StreamVersion(&d.want)
	switch {
	case d.events == 0 && !d.exists:
	case d.events == 0:
		d.Kind = "extra"
	case !d.exists:
		d.Kind = "missing"
	case d.StoredVersion < d.LogVersion:
		d.Kind, d.Fields = "stale", DiffFields(d.stored, d.want)
	default:
		if d.Fields = DiffFields(d.stored, d.want); len(d.Fields) > 0 {
			d.Kind = "different"
		}
	}
	return d, nil
}
