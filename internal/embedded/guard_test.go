package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func guardedUpsert(id string, v int64) mongo.WriteModel {
	return mongo.NewUpdateOneModel().SetUpsert(true).
		SetFilter(bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}}).
		SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: v}}}})
}

func versionOf(t *testing.T, coll *mongo.Collection, id string) int64 {
	t.Helper()
	var d struct {
		Version int64 `bson:"version"`
	}
	if err := coll.FindOne(t.Context(), bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	return d.Version
}

// TestGuardedBulkAnswersAsMongoDB: an unordered bulk of version-guarded
// upserts gets MongoDB's answer: each statement judged alone, a failed
// guard under upsert a duplicate key at its own index, one without upsert
// matching nothing, the statements after a failure still run, upserts
// numbered by statement; an ordered bulk stops at its first error.
func TestGuardedBulkAnswersAsMongoDB(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("guard").Collection("docs")
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "version", Value: int64(5)}}); err != nil {
			t.Fatal(err)
		}
	}
	models := []mongo.WriteModel{
		guardedUpsert("a", 4), // 0: a newer version is stored: duplicate key
		guardedUpsert("b", 6), // 1: moves forward
		mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: "a"}, {Key: "version", Value: bson.D{{Key: "$lt", Value: int64(5)}}}}).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}), // 2: no upsert: matches nothing
		guardedUpsert("c", 1), // 3: new document
		guardedUpsert("a", 5), // 4: equal version: duplicate key
	}
	res, err := coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		t.Fatalf("bulk: %v, want a bulk write exception", err)
	}
	var idx []int
	for _, we := range bwe.WriteErrors {
		if !mongo.IsDuplicateKeyError(we) {
			t.Errorf("statement %d: %v, want a duplicate key", we.Index, we)
		}
		idx = append(idx, we.Index)
	}
	if !slices.Equal(idx, []int{0, 4}) {
		t.Errorf("write errors at %v, want [0 4]", idx)
	}
	if res == nil || res.MatchedCount != 1 || res.ModifiedCount != 1 || res.UpsertedCount != 1 || res.UpsertedIDs[3] != "c" {
		t.Errorf("result %+v, want 1 matched, 1 modified, c upserted at 3", res)
	}
	for id, want := range map[string]int64{"a": 5, "b": 6, "c": 1} {
		if got := versionOf(t, coll, id); got != want {
			t.Errorf("%s at v%d, want v%d", id, got, want)
		}
	}
	var a bson.M
	_ = coll.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&a)
	if _, ok := a["x"]; ok {
		t.Errorf("a was changed by a statement whose guard failed: %v", a)
	}

	_, err = coll.BulkWrite(ctx, []mongo.WriteModel{guardedUpsert("b", 2), guardedUpsert("d", 1)}, options.BulkWrite().SetOrdered(true))
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 0 {
		t.Fatalf("ordered bulk: %v, want one duplicate key at 0", err)
	}
	if n, _ := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: "d"}}); n != 0 {
		t.Error("an ordered bulk ran a statement after its first error")
	}
}

// TestGuardedWritesRaceToTheHighestVersion: writers in several clients
// race version-guarded upserts of one document in random order; the
// document ends at the highest version, and no write ever lowered it.
func TestGuardedWritesRaceToTheHighestVersion(t *testing.T) {
	s, c := startStore(t, t.TempDir())
	ctx := t.Context()
	const writers, versions = 6, 40
	var wg sync.WaitGroup
	for w := range writers {
		cw, err := mongo.Connect(options.Client().ApplyURI(s.URI))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cw.Disconnect(ctx) })
		coll := cw.Database("guard").Collection("race")
		order := rand.Perm(versions)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, v := range order {
				_, err := coll.BulkWrite(ctx, []mongo.WriteModel{guardedUpsert("o", int64(v+1))}, options.BulkWrite().SetOrdered(false))
				var bwe mongo.BulkWriteException
				if err != nil && !(errors.As(err, &bwe) && mongo.IsDuplicateKeyError(err)) {
					t.Errorf("writer %d v%d: %v", w, v+1, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := versionOf(t, c.Database("guard").Collection("race"), "o"); got != versions {
		t.Fatalf("document at v%d after the race, want v%d", got, versions)
	}
}

// TestGuardOperators: the funnel serves the guards the service sends and
// passes any other update through to FerretDB.
func TestGuardOperators(t *testing.T) {
	for _, q := range []bson.D{
		{{Key: "_id", Value: "x"}, {Key: "v", Value: bson.A{int64(1)}}},                               // an array
		{{Key: "_id", Value: "x"}, {Key: "v", Value: bson.D{{Key: "$in", Value: bson.A{1}}}}},         // an operator the service does not send
		{{Key: "_id", Value: "x"}, {Key: "v", Value: bson.D{{Key: "$ne", Value: true}}}},              // one more
		{{Key: "_id", Value: "x"}, {Key: "at", Value: bson.D{{Key: "$lt", Value: bson.DateTime(1)}}}}, // a date
		{{Key: "_id", Value: "x"}, {Key: "v", Value: bson.D{{Key: "$lt", Value: math.NaN()}}}},        // no number
		{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"x"}}}}},                               // not one _id
		{{Key: "_id", Value: "x"}, {Key: "a.b", Value: bson.D{{Key: "$lt", Value: int64(1)}}}},        // dotted path
		{{Key: "_id", Value: "x"}, {Key: "a-b'", Value: bson.D{{Key: "$lt", Value: int64(1)}}}},       // a name SQL would need quoted
		{{Key: "_id", Value: int64(1)}, {Key: "v", Value: bson.D{{Key: "$lt", Value: int64(1)}}}},     // an _id FerretDB does not push down
		{{Key: "_id", Value: bson.NewObjectID()}, {Key: "v", Value: bson.D{{Key: "$lt", Value: 1}}}},  // an _id the service does not use
		{{Key: "_id", Value: "x"}, {Key: "$or", Value: bson.A{bson.D{{Key: "v", Value: int64(1)}}}}},  // a logical operator
	} {
		stmt, _ := bson.Marshal(bson.D{{Key: "q", Value: q}, {Key: "u", Value: bson.D{}}})
		if _, ok := guardOf(stmt); ok {
			t.Errorf("guardOf(%v) served, want it passed through", q)
		}
	}
	// A plain equality beyond _id: served without upsert (a fenced lease
	// write), passed through with it (the upsert would copy it).
	q := bson.D{{Key: "_id", Value: "x"}, {Key: "owner", Value: "a"}, {Key: "epoch", Value: int64(3)}}
	for _, upsert := range []bool{false, true} {
		stmt, _ := bson.Marshal(bson.D{{Key: "q", Value: q}, {Key: "u", Value: bson.D{}}, {Key: "upsert", Value: upsert}})
		if _, ok := guardOf(stmt); ok == upsert {
			t.Errorf("guardOf(%v) with upsert %v: served %v", q, upsert, ok)
		}
	}
}

// TestGuardsReadFromTheStore: the funnel judges a guard on the stored
// document (judged) as MongoDB does: for each kind a field may hold, under
// a string _id whose JSON text needs escaping, numbers of every width
// against each other exactly, strings byte by byte, and never a number
// against a string, an array, a document or a missing field. A bulk
// naming one _id twice sees its own first write.
func TestGuardsReadFromTheStore(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("guard").Collection("kinds")
	ctx := t.Context()
	fields := bson.D{{Key: "i32", Value: int32(5)}, {Key: "i64", Value: int64(1) << 60}, {Key: "i53", Value: int64(1)<<53 + 1},
		{Key: "dbl", Value: 2.5}, {Key: "whole", Value: 3.0}, {Key: "big", Value: float64(int64(1) << 60)}, {Key: "str", Value: "a<b>&\"é"}, {Key: "upper", Value: "Z"},
		{Key: "arr", Value: bson.A{int64(1)}}, {Key: "sub", Value: bson.D{{Key: "x", Value: int64(1)}}}}
	id := "k<&>\"1"
	if _, err := coll.InsertOne(ctx, append(bson.D{{Key: "_id", Value: id}}, fields...)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		guard bson.D
		want  bool
	}{
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$eq", Value: 5.0}}}}, true},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$lt", Value: int64(5)}}}}, false},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$lt", Value: int64(6)}}}}, true},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$lt", Value: 5.0}}}}, false},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$eq", Value: int64(5)}, {Key: "$lt", Value: int64(5)}}}}, false},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$eq", Value: int64(5)}, {Key: "$lt", Value: int64(6)}}}}, true},
		{bson.D{{Key: "i32", Value: int32(5)}}, true},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$eq", Value: "5"}}}}, false},
		{bson.D{{Key: "i32", Value: bson.D{{Key: "$lt", Value: "9"}}}}, false},
		{bson.D{{Key: "i64", Value: bson.D{{Key: "$eq", Value: int64(1) << 60}}}}, true},
		{bson.D{{Key: "i64", Value: bson.D{{Key: "$lt", Value: int64(1)<<60 + 1}}}}, true},
		{bson.D{{Key: "i64", Value: bson.D{{Key: "$lt", Value: int64(1) << 60}}}}, false},
		{bson.D{{Key: "i64", Value: bson.D{{Key: "$eq", Value: float64(int64(1) << 60)}}}}, true},
		// 2^53+1 has no double: compared exactly, as MongoDB compares it.
		{bson.D{{Key: "i53", Value: bson.D{{Key: "$eq", Value: float64(int64(1) << 53)}}}}, false},
		{bson.D{{Key: "i53", Value: bson.D{{Key: "$lt", Value: float64(int64(1)<<53 + 2)}}}}, true},
		{bson.D{{Key: "i53", Value: bson.D{{Key: "$lt", Value: int64(1)<<53 + 1}}}}, false},
		{bson.D{{Key: "dbl", Value: bson.D{{Key: "$lt", Value: int64(3)}}}}, true},
		{bson.D{{Key: "dbl", Value: bson.D{{Key: "$lt", Value: 2.5}}}}, false},
		{bson.D{{Key: "dbl", Value: bson.D{{Key: "$eq", Value: 2.5}}}}, true},
		{bson.D{{Key: "whole", Value: bson.D{{Key: "$eq", Value: int64(3)}}}}, true},
		{bson.D{{Key: "whole", Value: bson.D{{Key: "$lt", Value: 3.5}}}}, true},
		{bson.D{{Key: "whole", Value: bson.D{{Key: "$lt", Value: int32(3)}}}}, false},
		{bson.D{{Key: "big", Value: bson.D{{Key: "$eq", Value: int64(1) << 60}}}}, true},
		{bson.D{{Key: "big", Value: bson.D{{Key: "$lt", Value: int64(1)<<60 + 1}}}}, true},
		{bson.D{{Key: "str", Value: bson.D{{Key: "$eq", Value: "a<b>&\"é"}}}}, true},
		{bson.D{{Key: "str", Value: "a<b>&\"é"}}, true},
		{bson.D{{Key: "str", Value: bson.D{{Key: "$lt", Value: "a"}}}}, false},
		{bson.D{{Key: "str", Value: bson.D{{Key: "$lt", Value: "a<b>&\"f"}}}}, false}, // é's first byte sorts after f
		{bson.D{{Key: "str", Value: bson.D{{Key: "$lt", Value: "a<b>&\"\u00ea"}}}}, true},
		{bson.D{{Key: "upper", Value: bson.D{{Key: "$lt", Value: "a"}}}}, true},
		{bson.D{{Key: "str", Value: bson.D{{Key: "$lt", Value: int64(9)}}}}, false},
		{bson.D{{Key: "arr", Value: bson.D{{Key: "$lt", Value: int64(5)}}}}, false},
		{bson.D{{Key: "sub", Value: bson.D{{Key: "$eq", Value: int64(1)}}}}, false},
		{bson.D{{Key: "none", Value: bson.D{{Key: "$lt", Value: int64(5)}}}}, false},
	} {
		want := int64(0)
		if tc.want {
			want = 1
		}
		res, err := coll.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, tc.guard...), bson.D{{Key: "$inc", Value: bson.D{{Key: "hits", Value: 1}}}})
		if err != nil {
			t.Fatalf("%v on %v: %v", tc.guard, id, err)
		}
		if res.MatchedCount != want {
			t.Errorf("%v on _id %v: matched %d, want %d", tc.guard, id, res.MatchedCount, want)
		}
	}

	_, err := coll.BulkWrite(ctx, []mongo.WriteModel{guardedUpsert("twice", 2), guardedUpsert("twice", 3), guardedUpsert("twice", 3),
		guardedUpsert("once", 1)}, options.BulkWrite().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 2 {
		t.Fatalf("bulk naming one _id three times: %v, want one duplicate key at 2", err)
	}
	if got := versionOf(t, coll, "twice"); got != 3 {
		t.Errorf("twice at v%d, want v3", got)
	}
	if got := versionOf(t, coll, "once"); got != 1 {
		t.Errorf("once at v%d, want v1", got)
	}

	// Replacements of documents that do not exist go in as inserts; the
	// answer is an upsert's, numbered by statement.
	replace := func(id string, v int64) mongo.WriteModel {
		return mongo.NewReplaceOneModel().SetUpsert(true).
			SetFilter(bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}}).
			SetReplacement(bson.D{{Key: "_id", Value: id}, {Key: "version", Value: v}, {Key: "by", Value: "replace"}})
	}
	res, err := coll.BulkWrite(ctx, []mongo.WriteModel{replace("new-1", 1), replace("twice", 4), replace("new-2", 7)},
		options.BulkWrite().SetOrdered(false))
	if err != nil || res.MatchedCount != 1 || res.ModifiedCount != 1 || res.UpsertedCount != 2 ||
		res.UpsertedIDs[0] != "new-1" || res.UpsertedIDs[2] != "new-2" {
		t.Fatalf("replacements: %+v, %v; want twice replaced, new-1 and new-2 upserted at 0 and 2", res, err)
	}
	for id, v := range map[string]int64{"new-1": 1, "twice": 4, "new-2": 7} {
		var d struct {
			Version int64  `bson:"version"`
			By      string `bson:"by"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil || d.Version != v || d.By != "replace" {
			t.Errorf("%s: %+v, %v; want v%d by replace", id, d, err, v)
		}
	}
}

// TestLongBulksDoNotExhaustTheStore: FerretDB keeps a connection of its
// SQLite pool (100) per statement of an update until the command ends;
// an update of 100 statements or more waited for ever for one more, and
// the whole store with it. Bulks of 300 updates of existing documents,
// guarded and not, are answered, in runs the store can serve, and a read
// after them is too.
func TestLongBulksDoNotExhaustTheStore(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("guard").Collection("long")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 300
	var docs []any
	for i := range n {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("d%03d", i)}, {Key: "version", Value: int64(1)}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	guarded := make([]mongo.WriteModel, n)
	plain := make([]mongo.WriteModel, n)
	for i := range n {
		id := fmt.Sprintf("d%03d", i)
		guarded[i] = guardedUpsert(id, 2)
		plain[i] = mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}}).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "plain", Value: true}}}})
	}
	for name, models := range map[string][]mongo.WriteModel{"guarded": guarded, "plain": plain} {
		res, err := coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
		if err != nil {
			t.Fatalf("%s bulk of %d: %v", name, n, err)
		}
		if res.MatchedCount != n || res.ModifiedCount != n {
			t.Errorf("%s bulk: %d matched, %d modified, want %d", name, res.MatchedCount, res.ModifiedCount, n)
		}
	}
	if got := versionOf(t, coll, fmt.Sprintf("d%03d", n-1)); got != 2 {
		t.Errorf("last document at v%d, want v2", got)
	}
}

// TestGuardedReplacementsWriteTheDocumentsSent: guarded replacements of
// stored documents (written as rows in place, replaceRows) leave exactly
// the documents sent, found through the collection's indexes, with
// MongoDB's counts (an identical replacement modifies nothing); one that
// breaks a unique index goes to FerretDB, which refuses it (with an
// internal error, where MongoDB answers a duplicate key), and what it
// left in the replacements collection is not copied by the next.
func TestGuardedReplacementsWriteTheDocumentsSent(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("guard").Collection("summaries")
	ctx := t.Context()
	doc := func(id string, v int64, customer, email string) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "version", Value: v}, {Key: "customer_id", Value: customer},
			{Key: "email", Value: email}, {Key: "total", Value: 12.5}, {Key: "count", Value: int32(3)},
			{Key: "at", Value: bson.DateTime(1_700_000_000_000 + v)}, {Key: "lines", Value: bson.A{bson.D{{Key: "sku", Value: "x"}, {Key: "qty", Value: int64(v)}}}},
			{Key: "note", Value: nil}}
	}
	replace := func(filter bson.D, d bson.D) mongo.WriteModel {
		return mongo.NewReplaceOneModel().SetUpsert(true).SetFilter(filter).SetReplacement(d)
	}
	guard := func(id string, v int64) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}}
	}
	for _, id := range []string{"a", "b", "d"} {
		if _, err := coll.InsertOne(ctx, doc(id, 5, "c1", id+"@x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := coll.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "customer_id", Value: 1}, {Key: "_id", Value: 1}}},
		{Keys: bson.D{{Key: "email", Value: 1}}, Options: options.Index().SetUnique(true)},
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bson.D{"a": doc("a", 5, "c1", "a@x"), "b": doc("b", 6, "c2", "b@x"), "c": doc("c", 1, "c2", "c@x"), "d": doc("d", 7, "c2", "d2@x")}
	res, err := coll.BulkWrite(ctx, []mongo.WriteModel{
		replace(guard("a", 4), doc("a", 4, "c2", "a@x")), // a newer version is stored: duplicate key
		replace(guard("b", 6), want["b"]),
		replace(guard("c", 1), want["c"]), // new
		replace(guard("d", 7), want["d"]),
	}, options.BulkWrite().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 0 || !mongo.IsDuplicateKeyError(bwe.WriteErrors[0]) {
		t.Fatalf("bulk: %v, want one duplicate key at 0", err)
	}
	if res == nil || res.MatchedCount != 2 || res.ModifiedCount != 2 || res.UpsertedCount != 1 || res.UpsertedIDs[2] != "c" {
		t.Errorf("result %+v, want 2 matched, 2 modified, c upserted at 2", res)
	}
	check := func() {
		t.Helper()
		for id, w := range want {
			var got bson.Raw
			if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&got); err != nil {
				t.Fatalf("read %s: %v", id, err)
			}
			if wb, _ := bson.Marshal(w); !bytes.Equal(got, wb) {
				t.Errorf("%s is %s, want %s", id, got, bson.Raw(wb))
			}
		}
		cur, err := coll.Find(ctx, bson.D{{Key: "customer_id", Value: "c2"}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for cur.Next(ctx) {
			ids = append(ids, cur.Current.Lookup("_id").StringValue())
		}
		if !slices.Equal(ids, []string{"b", "c", "d"}) {
			t.Errorf("customer c2's documents %v, want [b c d]", ids)
		}
	}
	check()
	// The replacements went as rows: FerretDB encoded them in the
	// replacements collection, left empty.
	if n, err := c.Database("guard").Collection(replacements).CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Errorf("the replacements collection holds %d documents (%v), want 0", n, err)
	}
	if names, _ := c.Database("guard").ListCollectionNames(ctx, bson.D{}); !slices.Contains(names, replacements) {
		t.Errorf("collections %v: the replacements were not written as rows", names)
	}

	same, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: "b"}, {Key: "version", Value: bson.D{{Key: "$eq", Value: int64(6)}}}}, want["b"])
	if err != nil || same.MatchedCount != 1 || same.ModifiedCount != 0 {
		t.Errorf("identical replacement: %+v, %v; want 1 matched, 0 modified", same, err)
	}

	// As a process that died after the insert into the replacements
	// collection leaves it.
	if _, err := c.Database("guard").Collection(replacements).InsertOne(ctx, doc("c", 99, "c9", "c9@x")); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.BulkWrite(ctx, []mongo.WriteModel{replace(guard("a", 6), doc("a", 6, "c1", "a@x"))}); err != nil {
		t.Fatal(err)
	}
	want["a"] = doc("a", 6, "c1", "a@x")
	check()
	_, err = coll.BulkWrite(ctx, []mongo.WriteModel{replace(guard("d", 8), doc("d", 8, "c2", "b@x"))}, options.BulkWrite().SetOrdered(false))
	if err == nil || !strings.Contains(err.Error(), "UNIQUE constraint failed") {
		t.Errorf("a replacement breaking the unique email index: %v, want FerretDB's refusal", err)
	}
	if _, err := coll.BulkWrite(ctx, []mongo.WriteModel{replace(guard("a", 7), doc("a", 7, "c1", "a@x"))}); err != nil {
		t.Fatal(err)
	}
	want["a"] = doc("a", 7, "c1", "a@x")
	check()
}
