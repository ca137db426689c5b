package eventstore_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
)

// openStore returns a Store on a fresh database (MONGODB_URI or the
// embedded FerretDB) with its indexes, registered for the conformance
// suite's raw checks.
func openStore(t testing.TB, opts ...eventstore.Option) (*eventstore.Store, *mongo.Database) {
	t.Helper()
	db := storetest.Database(t)
	s := eventstore.New(db, opts...)
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatalf("ensure indexes: %v", err)
	}
	// Idempotent: a second call changes nothing.
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatalf("ensure indexes again: %v", err)
	}
	storetest.Register(t, s, db)
	return s, db
}

func TestConformance(t *testing.T) {
	storetest.RunConformance(t, func(t *testing.T) *eventstore.Store {
		s, _ := openStore(t)
		return s
	})
}

func TestAtomicity(t *testing.T) {
	storetest.RunAtomicity(t, storetest.AtomicityConfig{})
}
