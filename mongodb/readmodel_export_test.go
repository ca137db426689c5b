package mongodb

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/projection"
)

// NewReadModel returns the read model of def in its base collection in
// db, filling gaps from events; m may be nil.
func NewReadModel[D any](db *mongo.Database, def projection.Definition[D], events projection.Log, m *projection.Metrics) *projection.ReadModel[D] {
	return projection.NewReadModel(def, def.Collection, NewDocuments[D](db), events, m)
}

// PutPointer writes p with the compare-and-set on its generation.
func PutPointer(ctx context.Context, ps *Pointers, p projection.Pointer) error { return ps.put(ctx, p) }
