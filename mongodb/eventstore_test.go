package mongodb_test

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
)

func indexNames(t *testing.T, coll *mongo.Collection) map[string]bool {
	t.Helper()
	specs, err := coll.Indexes().ListSpecifications(t.Context())
	if err != nil {
		t.Fatalf("list indexes: %v", err)
	}
	names := map[string]bool{}
	for _, s := range specs {
		names[s.Name] = true
	}
	return names
}

// TestEnsureIndexesDropsTheOutboxIndexes: a log an earlier version
// indexed for its outbox marker (on (published, recorded_at) over every
// commit, or on recorded_at over the unpublished ones) gets the
// recorded_at index of the relay's catch-up in their place at start, and
// a restart changes nothing. So does the recorded_at index alone, which
// the (recorded_at, _id) index of the log browser replaces.
func TestEnsureIndexesDropsTheOutboxIndexes(t *testing.T) {
	for _, old := range []struct {
		name    string
		keys    bson.D
		partial bson.D
	}{
		{"recorded_at", bson.D{{Key: "recorded_at", Value: 1}}, nil},
		{"outbox", bson.D{{Key: "published", Value: 1}, {Key: "recorded_at", Value: 1}}, nil},
		{"outbox_unpublished", bson.D{{Key: "recorded_at", Value: 1}}, bson.D{{Key: "published", Value: false}}},
	} {
		db := storetest.Database(t)
		coll := db.Collection(mongodb.CommitsCollection)
		o := options.Index().SetName(old.name)
		// The embedded store of those versions created the partial index
		// whole; it takes none now.
		if d, err := mongodb.DialectOf(t.Context(), db.Client()); err == nil && d == mongodb.DialectMongoDB && old.partial != nil {
			o.SetPartialFilterExpression(old.partial)
		}
		if _, err := coll.Indexes().CreateOne(t.Context(), mongo.IndexModel{Keys: old.keys, Options: o}); err != nil {
			t.Fatalf("create the old index %s: %v", old.name, err)
		}
		s := mongodb.NewEventStore(db)
		for i := range 2 {
			if err := s.EnsureIndexes(t.Context()); err != nil {
				t.Fatalf("ensure indexes (run %d): %v", i+1, err)
			}
			names := indexNames(t, coll)
			if names["outbox"] || names["outbox_unpublished"] || names["recorded_at"] || !names["recorded_at_id"] {
				t.Fatalf("run %d: indexes %v, want recorded_at_id and neither recorded_at alone nor an outbox index", i+1, names)
			}
		}
	}
}

// TestEnsureIndexesReplacesTheGlobalKeyIndex: a log whose idempotency
// keys were unique across the whole log (the unique index on
// idempotency_key alone) gets the per-stream index in its place at start,
// keeps its commits, and from then on takes a key used on another stream.
func TestEnsureIndexesReplacesTheGlobalKeyIndex(t *testing.T) {
	db := storetest.Database(t)
	coll := db.Collection(mongodb.CommitsCollection)
	if _, err := coll.Indexes().CreateOne(t.Context(), mongo.IndexModel{
		Keys:    bson.D{{Key: "idempotency_key", Value: 1}},
		Options: options.Index().SetUnique(true).SetSparse(true).SetName("idempotency_key"),
	}); err != nil {
		t.Fatalf("create the global key index: %v", err)
	}
	s := mongodb.NewEventStore(db)
	key := storetest.Unique("key-")
	first := storetest.NewCommit(storetest.Unique("order-"), 0, domain.OrderApproved{})
	first.IdempotencyKey, first.RequestHash = key, "hash-1"
	if _, err := s.Append(t.Context(), first); err != nil {
		t.Fatal(err)
	}

	for i := range 2 { // the second run is a restart: nothing to change
		if err := s.EnsureIndexes(t.Context()); err != nil {
			t.Fatalf("ensure indexes (run %d): %v", i+1, err)
		}
		names := indexNames(t, coll)
		if names["idempotency_key"] || !names["stream_idempotency_key"] {
			t.Fatalf("run %d: indexes %v, want stream_idempotency_key and no idempotency_key", i+1, names)
		}
	}
	if _, err := s.FindIdempotencyKey(t.Context(), key, first.StreamID); err != nil {
		t.Fatalf("find the stored key: %v", err)
	}
	elsewhere := storetest.NewCommit(storetest.Unique("order-"), 0, domain.OrderApproved{})
	elsewhere.IdempotencyKey, elsewhere.RequestHash = key, "hash-2"
	if _, err := s.Append(t.Context(), elsewhere); err != nil {
		t.Fatalf("the key on another stream: %v, want stored", err)
	}
	again := storetest.NewCommit(first.StreamID, 1, domain.OrderShipped{})
	again.IdempotencyKey, again.RequestHash = key, "hash-3"
	if _, err := s.Append(t.Context(), again); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Fatalf("the key again in its stream: %v, want ErrDuplicateRequest", err)
	}
}

// TestServiceRetriesPlaceWithKeyOnOneStream: a PlaceOrder with an
// idempotency key and no order id, retried on other instances (no shared
// cache) after a lost answer, lands on the stream of the first request
// and is answered with its result; the log holds one order. The same key
// with another body is refused, and without a key every request is a new
// order.
func TestServiceRetriesPlaceWithKeyOnOneStream(t *testing.T) {
	s, _ := storetest.OpenStore(t)
	place := domain.PlaceOrder{CustomerID: "cust-1", Currency: "BRL",
		Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 4990}}}
	key := domain.ExecOptions{IdempotencyKey: storetest.Unique("key-")}

	first, err := domain.NewService(s, nil).Execute(t.Context(), "", place, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := domain.KeyedOrderID(key.IdempotencyKey); first.OrderID != want {
		t.Fatalf("order id %s, want KeyedOrderID(key) %s", first.OrderID, want)
	}
	for i := range 3 {
		r, err := domain.NewService(s, nil).Execute(t.Context(), "", place, key)
		if err != nil || r.OrderID != first.OrderID || r.Version != 1 || !r.Replayed {
			t.Fatalf("retry %d: %+v, %v; want a replay of order %s at v1", i, r, err, first.OrderID)
		}
	}
	other := place
	other.Currency = "USD"
	if r, err := domain.NewService(s, nil).Execute(t.Context(), "", other, key); !errors.Is(err, domain.ErrIdempotencyKeyReused) {
		t.Fatalf("another body under the key: %+v, %v; want ErrIdempotencyKeyReused", r, err)
	}
	if evs, err := s.Load(t.Context(), first.OrderID, 0); err != nil || len(evs) != 1 {
		t.Fatalf("order %s: %d events, %v; want 1", first.OrderID, len(evs), err)
	}

	a, errA := domain.NewService(s, nil).Execute(t.Context(), "", place, domain.ExecOptions{})
	b, errB := domain.NewService(s, nil).Execute(t.Context(), "", place, domain.ExecOptions{})
	if errA != nil || errB != nil || a.OrderID == b.OrderID {
		t.Fatalf("two places without key: %+v %v, %+v %v; want two orders", a, errA, b, errB)
	}
}
