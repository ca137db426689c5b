package mongodb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/projection"
)

// Check compares one stream's document in the active collection with a
// fresh fold of the stream's log, as a verify job's recheck does, and
// changes nothing. The document is read before the log, so a live write
// in between cannot make it look ahead of the log. A stream that neither
// the log nor the read model knows is reported "equal" with both sides
// null. A projection not built yet is reported "not-built", and one whose
// readers read another version than this process folds (a rolling
// upgrade) "other-version": neither is compared. Errors: the store's
// (domain.ErrUnavailable) and the log's.
func (p *Projection[D]) Check(ctx context.Context, id string) (projection.ReadModelCheck, error) {
	c := projection.ReadModelCheck{Projection: p.def.Name, Document: json.RawMessage("null"), Expected: json.RawMessage("null")}
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
	s := p.ReadModel(ptr.Active)
	var d stored[D]
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	exists := err == nil
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return c, fmt.Errorf("check %s %s: %w", s.def.Collection, id, Translate(err))
	}
	evs, err := p.events.LoadFrom(ctx, id, 1)
	if err != nil {
		return c, fmt.Errorf("check %s %s: %w", s.def.Collection, id, err)
	}
	want, n, ferr := p.def.Fold(evs)
	if ferr != nil {
		c.FoldError = ferr.Error()
	}
	if exists {
		c.StoredVersion = p.def.StreamVersion(&d.Doc)
		if c.Document, err = json.Marshal(d.Doc); err != nil {
			return c, fmt.Errorf("check %s %s: %w", s.def.Collection, id, err)
		}
	}
	if n > 0 {
		c.LogVersion = p.def.StreamVersion(&want)
		if c.Expected, err = json.Marshal(want); err != nil {
			return c, fmt.Errorf("check %s %s: %w", s.def.Collection, id, err)
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
		c.State, c.Fields = "stale", projection.DiffFields(d.Doc, want)
	default:
		c.Fields = projection.DiffFields(d.Doc, want)
		c.State = "equal"
		if len(c.Fields) > 0 {
			c.State = "different"
		}
	}
	return c, nil
}
