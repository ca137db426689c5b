package embedded

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func startStore(t testing.TB, dir string, opts ...StoreOption) (*Store, *mongo.Client) {
	t.Helper()
	s, err := StartStore(dir, "127.0.0.1:0", nil, opts...)
	if err != nil {
		t.Fatalf("start store: %v", err)
	}
	c, err := mongo.Connect(options.Client().ApplyURI(s.URI))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Disconnect(context.Background())
		_ = s.Close()
	})
	return s, c
}

// plan returns the SQLite query plan FerretDB reports for a find by _id:
// its explain command runs EXPLAIN QUERY PLAN on the very SQL it sends.
//
// A SQLite connection plans EXPLAIN with the schema it last loaded, and
// reloads it only when it runs a statement: a real find first brings the
// connection FerretDB then reuses for the explain up to date (the real
// find itself was re-prepared with the new index as soon as it ran).
func plan(t *testing.T, coll *mongo.Collection) string {
	t.Helper()
	if err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: "k-00042"}}).Err(); err != nil && err != mongo.ErrNoDocuments {
		t.Fatalf("find by _id: %v", err)
	}
	var res bson.Raw
	err := coll.Database().RunCommand(t.Context(), bson.D{{Key: "explain", Value: bson.D{
		{Key: "find", Value: coll.Name()}, {Key: "filter", Value: bson.D{{Key: "_id", Value: "k-00042"}}},
	}}}).Decode(&res)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	p, err := res.LookupErr("queryPlanner", "Plan")
	if err != nil {
		t.Fatalf("explain of %s has no queryPlanner.Plan: %s", coll.Name(), res)
	}
	return p.String()
}

// usesIDIndex fails t unless a find by _id on coll is a search of the _id
// expression index, not a scan of the table.
func usesIDIndex(t *testing.T, coll *mongo.Collection) {
	t.Helper()
	p := plan(t, coll)
	if !strings.Contains(p, "SEARCH") || !strings.Contains(p, "_id_path") {
		t.Fatalf("find by _id on %s is not an index search: %s", coll.Name(), p)
	}
}

func fill(t *testing.T, coll *mongo.Collection, n int) {
	t.Helper()
	docs := make([]any, n)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: fmt.Sprintf("k-%05d", i)}, {Key: "n", Value: i}}
	}
	if _, err := coll.InsertMany(t.Context(), docs); err != nil {
		t.Fatalf("fill %s: %v", coll.Name(), err)
	}
}

// TestIDLookupsUseAnIndex fails when FerretDB's SQL for a find by _id
// stops matching the expression index (a FerretDB upgrade that changes its
// SQL), or when a way of creating a collection goes without it.
func TestIDLookupsUseAnIndex(t *testing.T) {
	dir := t.TempDir()
	_, c := startStore(t, dir)
	db := c.Database("plans")
	ctx := t.Context()

	t.Run("CreatedByInsert", func(t *testing.T) {
		coll := db.Collection("inserted")
		fill(t, coll, 100)
		usesIDIndex(t, coll)
	})
	t.Run("CreatedByUpsert", func(t *testing.T) {
		coll := db.Collection("upserted")
		err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}},
			options.FindOneAndUpdate().SetUpsert(true)).Err()
		if err != nil && err != mongo.ErrNoDocuments {
			t.Fatal(err)
		}
		usesIDIndex(t, coll)
	})
	t.Run("CreatedByCreateIndexes", func(t *testing.T) {
		coll := db.Collection("indexed")
		if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "n", Value: 1}}}); err != nil {
			t.Fatal(err)
		}
		usesIDIndex(t, coll)
	})
	t.Run("DroppedAndCreatedAgain", func(t *testing.T) {
		coll := db.Collection("again")
		fill(t, coll, 10)
		if err := coll.Drop(ctx); err != nil {
			t.Fatal(err)
		}
		fill(t, coll, 10)
		usesIDIndex(t, coll)
	})
	t.Run("DatabaseDroppedAndCreatedAgain", func(t *testing.T) {
		other := c.Database("plans2")
		fill(t, other.Collection("x"), 10)
		if err := other.Drop(ctx); err != nil {
			t.Fatal(err)
		}
		fill(t, other.Collection("x"), 10)
		usesIDIndex(t, other.Collection("x"))
	})
}

// TestIDIndexAppliedAtStart: a table that lost its index (a file written by
// a store without the funnel) gets it back when the store starts.
func TestIDIndexAppliedAtStart(t *testing.T) {
	dir := t.TempDir()
	s, c := startStore(t, dir)
	coll := c.Database("restart").Collection("events")
	fill(t, coll, 50)
	usesIDIndex(t, coll)
	_ = c.Disconnect(t.Context())
	_ = s.Close()

	h, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "restart.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	var table string
	if err := h.QueryRow(`SELECT table_name FROM _ferretdb_collections WHERE name = 'events'`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Exec(fmt.Sprintf(`DROP INDEX %q`, table+"_id_path")); err != nil {
		t.Fatal(err)
	}
	_ = h.Close()

	_, c = startStore(t, dir)
	coll = c.Database("restart").Collection("events")
	usesIDIndex(t, coll)
	var got struct {
		N int `bson:"n"`
	}
	if err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: "k-00042"}}).Decode(&got); err != nil || got.N != 42 {
		t.Fatalf("find by _id after restart: %+v, %v", got, err)
	}
}

// TestIndexedStoreKeepsWorking exercises what FerretDB does to a table
// with the extra index: update, upsert, delete, and reads of each. A
// rename, which the funnel's cache and indexes could not follow, is
// refused.
func TestIndexedStoreKeepsWorking(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	coll := c.Database("ops").Collection("c")
	fill(t, coll, 20)
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "k-00003"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 300}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "new"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: -1}}}},
		options.UpdateOne().SetUpsert(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "k-00004"}}); err != nil {
		t.Fatal(err)
	}
	err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "renameCollection", Value: "ops.c"}, {Key: "to", Value: "ops.d"}}).Err()
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(codeCommandNotSupported) {
		t.Fatalf("rename: %v, want CommandNotSupported", err)
	}
	usesIDIndex(t, coll)
	for id, want := range map[string]int{"k-00003": 300, "new": -1, "k-00005": 5} {
		var got struct {
			N int `bson:"n"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&got); err != nil || got.N != want {
			t.Errorf("%s: n=%d, %v; want %d", id, got.N, err, want)
		}
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "k-00004"}}).Err(); err != mongo.ErrNoDocuments {
		t.Errorf("deleted document: %v", err)
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 20 {
		t.Errorf("count: %d, %v; want 20", n, err)
	}
}

// TestWriteCostsByKind: every write through the funnel is counted under
// its command and collection, a rebuilt collection's version and job
// suffix left out, and their times held stay within the writer's busy
// time; reads are not counted.
func TestWriteCostsByKind(t *testing.T) {
	s, c := startStore(t, t.TempDir())
	db := c.Database("costs")
	ctx := t.Context()
	if _, err := db.Collection("events").InsertOne(ctx, bson.D{{Key: "_id", Value: "a:1"}}); err != nil {
		t.Fatal(err)
	}
	for _, coll := range []string{"order_summaries", "order_summaries_v2_0123456789abcdef0123456789abcdef"} {
		if _, err := db.Collection(coll).UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 1}}}},
			options.UpdateOne().SetUpsert(true)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Collection("order_summaries").FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Err(); err != nil {
		t.Fatal(err)
	}
	costs := s.WriteCosts()
	var held time.Duration
	for _, c := range costs {
		held += c.Held
	}
	ins, upd := costs[WriteKind{"insert", "events"}], costs[WriteKind{"update", "order_summaries"}]
	if ins.Writes != 1 || upd.Writes != 2 || ins.Held <= 0 || upd.Held <= 0 {
		t.Errorf("costs %+v; want 1 insert into events and 2 updates of order_summaries, each with its time", costs)
	}
	if busy := s.WriteBusy(); held > busy {
		t.Errorf("writes held the writer %v in all, more than its busy time %v", held, busy)
	}
}
