package mongodb

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// EnsureCollectionIndexes creates the projection's indexes on collection
// coll, such as a rebuild's shadow before it is written. Errors:
// domain.ErrUnavailable.
func (p *Projection[D]) EnsureCollectionIndexes(ctx context.Context, coll string) error {
	return p.ReadModel(coll).EnsureIndexes(ctx)
}

// WriteFolds folds each stream of a rebuild's batch and writes its
// document into coll: one unordered insert of the batch, and, for the
// documents a live projector has already written, the version-guarded
// write, so neither side can go back a version. It then records each
// document's version and hash in projection.SumsCollection(coll), in one more
// unordered insert, for the rebuild's finish (VerifySums). A stream that
// cannot be folded (or read: StreamEvents.Err) is counted as poison and
// its good events are kept. Errors: the store's (domain.ErrUnavailable).
func (p *Projection[D]) WriteFolds(ctx context.Context, coll string, streams []domain.StreamEvents) (projection.FoldResult, error) {
	s := p.ReadModel(coll)
	var res projection.FoldResult
	var docs []folded[D]
	for _, st := range streams {
		res.Events += int64(len(st.Events))
		doc, n, err := p.def.Fold(st.Events)
		if err == nil {
			err = st.Err
		}
		if err != nil {
			res.Poison++
			if len(res.Errors) < 5 {
				res.Errors = append(res.Errors, err.Error())
			}
		}
		if n > 0 {
			docs = append(docs, folded[D]{id: st.StreamID, doc: doc, events: n})
		}
	}
	if len(docs) == 0 {
		return res, nil
	}
	all := make([]any, len(docs))
	for i, d := range docs {
		body, err := storedBSON(d.id, d.doc)
		if err != nil {
			return res, fmt.Errorf("%s: encode %s: %w", p.def.Name, d.id, err)
		}
		all[i] = body
	}
	_, err := s.coll.InsertMany(ctx, all, options.InsertMany().SetOrdered(false))
	if err != nil {
		met, err := splitSuperseded(err)
		if err != nil {
			return res, fmt.Errorf("%s: insert into %s: %w", p.def.Name, coll, Translate(err))
		}
		// Some documents exist: live writes got there first. They go
		// through the version guard, which leaves a document a live
		// projector already holds at or past the fold as it is.
		var again []folded[D]
		for i := range met {
			again = append(again, docs[i])
		}
		res.Guarded = int64(len(again))
		if _, err := s.write(ctx, again); err != nil {
			return res, err
		}
	}
	// After the documents: a batch whose sums fail is not checkpointed,
	// and its scan writes it again, documents and sums.
	return res, p.recordSums(ctx, projection.SumsCollection(coll), docs)
}

// storedBSON is the stored form of doc: {_id, fields...}.
func storedBSON[D any](id string, doc D) (bson.D, error) {
	raw, err := marshalJSONTags(doc)
	if err != nil {
		return nil, err
	}
	elems, err := raw.Elements()
	if err != nil {
		return nil, err
	}
	out := bson.D{{Key: "_id", Value: id}}
	for _, el := range elems {
		if k := el.Key(); k != "_id" {
			out = append(out, bson.E{Key: k, Value: el.Value()})
		}
	}
	return out, nil
}
