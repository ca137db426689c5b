package mongodb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// jsonNames stores the domain's types that the adapter keeps as they are
// (read-model documents, a job's report, a task's resumes) under their
// JSON field names, so the domain needs no BSON tags; the adapter's own
// documents have BSON tags, which come first.
var jsonNames = &options.BSONOptions{UseJSONStructTags: true}

// jsonTags is the options of a collection of read-model documents.
var jsonTags = options.Collection().SetBSONOptions(jsonNames)

// Documents keeps the documents of a read model of one document per
// stream (projection.Store): {_id: stream id, fields of D under their JSON
// names, version}. Every save is a compare-and-set on version: a
// replacement with upsert whose filter is {_id, version: {$lt: v}}. A
// write of an older or equal version matches nothing, and its upsert
// meets the existing _id: a duplicate key, which means a newer version is
// already stored, so the write is done. A batch is one unordered bulk
// write of such replacements; the embedded store's funnel serves the
// guard at index speed.
type Documents[D any] struct {
	db      *mongo.Database
	dialect dialectOf
}

var _ projection.Store[domain.Order] = (*Documents[domain.Order])(nil)

// NewDocuments returns the read-model documents kept in db.
func NewDocuments[D any](db *mongo.Database) *Documents[D] { return &Documents[D]{db: db} }

// NewProjection returns the projection def kept in db, its pointer read
// through ps, filling gaps from events; m may be nil.
func NewProjection[D any](db *mongo.Database, def projection.Definition[D], events projection.Log, m *projection.Metrics, ps *Pointers) *projection.Model[D] {
	return projection.NewModel(def, NewDocuments[D](db), events, m, ps)
}

func (s *Documents[D]) coll(name string) *mongo.Collection { return s.db.Collection(name, jsonTags) }

// stored is a read-model document with its stream id as _id.
type stored[D any] struct {
	ID  string `bson:"_id"`
	Doc D      `bson:",inline"`
}

// parallel is how many documents the embedded store's dialect reads at
// once.
const parallel = 4

// Load returns the documents of ids that exist: one {_id: {$in: ids}}
// find on MongoDB; on the embedded store one {_id: v} look-up per
// document, 4 in flight, because FerretDB scans the whole collection for
// an $in.
func (s *Documents[D]) Load(ctx context.Context, coll string, ids []string) (map[string]D, error) {
	out := make(map[string]D, len(ids))
	dialect, err := s.dialect.of(ctx, s.db)
	if err != nil {
		return nil, err
	}
	c := s.coll(coll)
	if dialect == DialectFerretDB || len(ids) == 1 {
		var mu sync.Mutex
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(parallel)
		for _, id := range ids {
			g.Go(func() error {
				d, found, err := findOne[stored[D]](gctx, c, bson.D{{Key: "_id", Value: id}})
				if err != nil || !found {
					return err
				}
				mu.Lock()
				out[id] = d.Doc
				mu.Unlock()
				return nil
			})
		}
		return out, g.Wait()
	}
	docs, err := findAll[stored[D]](ctx, c, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		out[d.ID] = d.Doc
	}
	return out, nil
}

// guarded is the filter of a write of version v of document id: it
// matches the document only while it is older.
func guarded(id string, v int64) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}}
}

// Save stores docs in one unordered bulk write of version-guarded
// replacements (see Documents).
func (s *Documents[D]) Save(ctx context.Context, coll string, docs []projection.Doc[D]) (map[int]bool, error) {
	if len(docs) == 0 {
		return nil, nil
	}
	models := make([]mongo.WriteModel, len(docs))
	for i, d := range docs {
		body, v, err := storedBSON(d.ID, d.Doc)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", d.ID, err)
		}
		models[i] = mongo.NewReplaceOneModel().SetFilter(guarded(d.ID, v)).SetReplacement(body).SetUpsert(true)
	}
	_, err := s.coll(coll).BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	return splitSuperseded(err)
}

// Insert inserts docs in one unordered insert; FerretDB reports an
// unordered insert's duplicate keys at their own indexes, as MongoDB does
// (TestUnorderedInsertAnswersAsMongoDB).
func (s *Documents[D]) Insert(ctx context.Context, coll string, docs []projection.Doc[D]) (map[int]bool, error) {
	all := make([]any, len(docs))
	for i, d := range docs {
		body, _, err := storedBSON(d.ID, d.Doc)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", d.ID, err)
		}
		all[i] = body
	}
	_, err := s.coll(coll).InsertMany(ctx, all, options.InsertMany().SetOrdered(false))
	return splitSuperseded(err)
}

// Overwrite replaces document id if it is at version stored, or inserts
// it if exists is false and there is none.
func (s *Documents[D]) Overwrite(ctx context.Context, coll, id string, doc D, stored int64, exists bool) error {
	body, _, err := storedBSON(id, doc)
	if err != nil {
		return fmt.Errorf("encode %s: %w", id, err)
	}
	if exists {
		filter := bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$eq", Value: stored}}}}
		_, err = s.coll(coll).ReplaceOne(ctx, filter, body)
	} else if _, err = s.coll(coll).InsertOne(ctx, body); mongo.IsDuplicateKeyError(err) {
		err = nil // a live write created it meanwhile
	}
	return Translate(err)
}

// Delete deletes document id.
func (s *Documents[D]) Delete(ctx context.Context, coll, id string) error {
	_, err := s.coll(coll).DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
	return Translate(err)
}

// Each reads coll once, in batches of 1,000.
func (s *Documents[D]) Each(ctx context.Context, coll string, fn func(id string, doc D) error) error {
	return eachDoc(ctx, s.coll(coll), func(d stored[D]) error { return fn(d.ID, d.Doc) })
}

// eachDoc reads c once, in batches of 1,000, and calls fn with each
// document, decoded, until fn returns an error (which it returns).
func eachDoc[T any](ctx context.Context, c *mongo.Collection, fn func(T) error) error {
	return eachFound(ctx, c, "read "+c.Name(), bson.D{}, options.Find().SetBatchSize(1000), func(cur *mongo.Cursor) error {
		var d T
		if err := cur.Decode(&d); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		return fn(d)
	})
}

// eachFound calls fn with the cursor at each document filter selects,
// until fn returns an error, which it returns as it is; the store's
// errors are wrapped in what and domain.ErrUnavailable (Translate).
func eachFound(ctx context.Context, c *mongo.Collection, what string, filter bson.D, opts options.Lister[options.FindOptions], fn func(*mongo.Cursor) error) error {
	cur, err := c.Find(ctx, filter, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", what, Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		if err := fn(cur); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, Translate(err))
	}
	return nil
}

// findOne reads the document filter selects into a T; found is false
// when there is none. Errors: domain.ErrUnavailable (Translate).
func findOne[T any](ctx context.Context, c *mongo.Collection, filter bson.D, opts ...options.Lister[options.FindOneOptions]) (doc T, found bool, err error) {
	err = c.FindOne(ctx, filter, opts...).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return doc, false, nil
	}
	return doc, err == nil, Translate(err)
}

// findAll reads every document filter selects, decoded. Errors:
// domain.ErrUnavailable (Translate).
func findAll[T any](ctx context.Context, c *mongo.Collection, filter bson.D, opts ...options.Lister[options.FindOptions]) ([]T, error) {
	cur, err := c.Find(ctx, filter, opts...)
	if err != nil {
		return nil, Translate(err)
	}
	var docs []T
	if err := cur.All(ctx, &docs); err != nil {
		return nil, Translate(err)
	}
	return docs, nil
}

// EnsureIndexes creates the indexes one per call: FerretDB 1.24 drops the
// connection when one call names several indexes that already exist.
func (s *Documents[D]) EnsureIndexes(ctx context.Context, coll string, indexes [][]string) error {
	for _, fields := range indexes {
		keys := bson.D{}
		for _, f := range fields {
			keys = append(keys, bson.E{Key: f, Value: 1})
		}
		if _, err := s.coll(coll).Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys}); err != nil {
			return fmt.Errorf("create index on %s: %w", coll, Translate(err))
		}
	}
	return nil
}

// sumDoc is the stored form of a projection.Sum.
type sumDoc struct {
	ID      string `bson:"_id"`
	Version int64  `bson:"version"`
	Hash    []byte `bson:"hash"`
}

// SaveSums records sums (see insertOrReplace).
func (s *Documents[D]) SaveSums(ctx context.Context, coll string, sums []projection.Sum) error {
	docs := make([]sumDoc, len(sums))
	for i, sm := range sums {
		docs[i] = sumDoc{ID: sm.ID, Version: sm.Version, Hash: sm.Hash[:]}
	}
	return insertOrReplace(ctx, s.db.Collection(projection.SumsCollection(coll)), docs, func(d sumDoc) string { return d.ID })
}

// insertOrReplace writes docs to c in one unordered insert; the documents
// of streams already recorded (a scan retried from its cursor writes the
// streams after it again, or a deposed owner's late batch did) are
// duplicate keys, and only those are then replaced, by _id (id).
func insertOrReplace[T any](ctx context.Context, c *mongo.Collection, docs []T, id func(T) string) error {
	_, err := c.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	if err == nil {
		return nil
	}
	met, err := splitSuperseded(err)
	if err != nil {
		return err
	}
	for i := range met {
		if _, err := c.ReplaceOne(ctx, bson.D{{Key: "_id", Value: id(docs[i])}}, docs[i], options.Replace().SetUpsert(true)); err != nil {
			return fmt.Errorf("%s of %s: %w", c.Name(), id(docs[i]), Translate(err))
		}
	}
	return nil
}

// EachSum reads the sums recorded for coll once, in batches of 1,000. A
// hash of the wrong length reads as zero, which matches no document.
func (s *Documents[D]) EachSum(ctx context.Context, coll string, fn func(projection.Sum) error) error {
	return eachDoc(ctx, s.db.Collection(projection.SumsCollection(coll)), func(d sumDoc) error {
		sm := projection.Sum{ID: d.ID, Version: d.Version}
		if len(d.Hash) == len(sm.Hash) {
			sm.Hash = [32]byte(d.Hash)
		}
		return fn(sm)
	})
}

// splitSuperseded splits the error of an unordered bulk write of guarded
// writes (or inserts): the indexes whose write met an existing _id (a
// duplicate key), and what else went wrong (nil if nothing; Translate).
func splitSuperseded(err error) (map[int]bool, error) {
	var bwe mongo.BulkWriteException
	if err == nil || !errors.As(err, &bwe) || bwe.WriteConcernError != nil {
		return nil, Translate(err)
	}
	refused := map[int]bool{}
	for _, we := range bwe.WriteErrors {
		if !mongo.IsDuplicateKeyError(we) {
			return nil, Translate(err)
		}
		refused[we.Index] = true
	}
	return refused, nil
}

// storedBSON is the stored form of doc, {_id, fields...} with its JSON
// field names, and its version field.
func storedBSON[D any](id string, doc D) (bson.Raw, int64, error) {
	buf := new(bytes.Buffer)
	enc := bson.NewEncoder(bson.NewDocumentWriter(buf))
	enc.UseJSONStructTags()
	if err := enc.Encode(stored[D]{ID: id, Doc: doc}); err != nil {
		return nil, 0, err
	}
	raw := bson.Raw(buf.Bytes())
	v, _ := raw.Lookup("version").AsInt64OK()
	return raw, v, nil
}
