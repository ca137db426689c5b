package eventstore

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/mongodb"
)

// NewLease returns the lease named name of db for owner, claimed and
// renewed for ttl at a time: mongodb.NewLease.
//
// Deprecated: the lease lives in the MongoDB adapter; use mongodb.NewLease.
func NewLease(db *mongo.Database, name, owner string, ttl time.Duration) *mongodb.Lease {
	return mongodb.NewLease(db, name, owner, ttl)
}
