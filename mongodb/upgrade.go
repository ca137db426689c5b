package mongodb

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Unused names the collections earlier versions of the service kept and
// this one does not: the partition leases and members of the projectors,
// whose partitions JetStream now pins to one process at a time.
var Unused = []string{"projection_partitions", "projection_members"}

// DropUnused drops the Unused collections of db; a collection that does
// not exist is not an error. Errors: domain.ErrUnavailable.
func DropUnused(ctx context.Context, db *mongo.Database) error {
	for _, name := range Unused {
		if err := db.Collection(name).Drop(ctx); err != nil {
			return fmt.Errorf("drop %s: %w", name, Translate(err))
		}
	}
	return nil
}
