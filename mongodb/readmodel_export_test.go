package mongodb

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// NewReadModel returns the read model of def in its base collection in
// db, filling gaps from events; m may be nil.
func NewReadModel[D any](db *mongo.Database, def projection.Definition[D], events projection.Log, m *projection.Metrics) *projection.ReadModel[D] {
	return projection.NewReadModel(def, def.Collection, NewDocuments[D](db), events, m)
}

// PutPointer writes p with the compare-and-set on its generation.
func PutPointer(ctx context.Context, ps *Pointers, p projection.Pointer) error { return ps.put(ctx, p) }

// Doc returns document id of collection coll in db, or an error wrapping
// domain.ErrNotFound.
func Doc[D any](ctx context.Context, db *mongo.Database, coll, id string) (D, error) {
	docs, err := NewDocuments[D](db).Load(ctx, coll, []string{id})
	d, ok := docs[id]
	if err == nil && !ok {
		err = fmt.Errorf("%s %s: %w", coll, id, domain.ErrNotFound)
	}
	return d, err
}
