package embedded

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// sortedIDs returns the sorted _ids of what a find or aggregate returned.
func sortedIDs(t *testing.T, cur *mongo.Cursor, err error) []string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(t.Context(), &docs); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range docs {
		ids = append(ids, d.ID)
	}
	slices.Sort(ids)
	return ids
}

func wantCode(t *testing.T, what string, err error, code int32) {
	t.Helper()
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(int(code)) {
		t.Errorf("%s: %v, want error code %d", what, err, code)
	}
}

// TestViewsAnswerAsMongoDB: a view with an empty pipeline, which FerretDB
// 1.24 refuses, is served by the funnel as MongoDB serves it: created with
// create/viewOn, read with find (across getMore), aggregate, count and
// distinct, listed with type "view" under listCollections' filter,
// repointed with collMod, kept across a restart, dropped; writes, index
// commands and listIndexes on it are refused with CommandNotSupportedOnView.
func TestViewsAnswerAsMongoDB(t *testing.T) {
	dir := t.TempDir()
	s, c := startStore(t, dir)
	idsOf := func(cur *mongo.Cursor, err error) []string { return sortedIDs(t, cur, err) }
	db := c.Database("views")
	ctx := t.Context()
	for coll, ids := range map[string][]string{"live_1": {"a", "b", "c", "d", "e"}, "live_2": {"x", "y"}} {
		for _, id := range ids {
			if _, err := db.Collection(coll).InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "coll", Value: coll}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := db.CreateView(ctx, "live", "live_1", bson.A{}); err != nil {
		t.Fatalf("create view: %v", err)
	}
	view := db.Collection("live")
	if got := idsOf(view.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Errorf("find on the view across getMore: %v", got)
	}
	if got := idsOf(view.Find(ctx, bson.D{{Key: "_id", Value: "c"}})); !slices.Equal(got, []string{"c"}) {
		t.Errorf("find by _id on the view: %v", got)
	}
	if got := idsOf(view.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: "c"}}}}}}})); !slices.Equal(got, []string{"d", "e"}) {
		t.Errorf("aggregate on the view: %v", got)
	}
	if n, err := view.CountDocuments(ctx, bson.D{}); err != nil || n != 5 {
		t.Errorf("countDocuments on the view: %d, %v", n, err)
	}
	if n, err := view.EstimatedDocumentCount(ctx); err != nil || n != 5 {
		t.Errorf("count on the view: %d, %v", n, err)
	}
	var colls []string
	if err := view.Distinct(ctx, "coll", bson.D{}).Decode(&colls); err != nil || !slices.Equal(colls, []string{"live_1"}) {
		t.Errorf("distinct on the view: %v, %v", colls, err)
	}

	var plan struct {
		FilterPushdown bool `bson:"filterPushdown"`
	}
	explain := bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: "live"}, {Key: "filter", Value: bson.D{{Key: "_id", Value: "c"}}}}}, {Key: "verbosity", Value: "queryPlanner"}}
	if err := db.RunCommand(ctx, explain).Decode(&plan); err != nil || !plan.FilterPushdown {
		t.Errorf("explain of a find by _id on the view: %+v, %v; want the collection's plan, by _id", plan, err)
	}

	specs, err := db.ListCollectionSpecifications(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, sp := range specs {
		types[sp.Name] = sp.Type
	}
	if types["live"] != "view" || types["live_1"] != "collection" {
		t.Errorf("listCollections: %v, want live a view and live_1 a collection", types)
	}
	for filter, want := range map[string][]string{
		`{"type": "view"}`:             {"live"},
		`{"name": "live"}`:             {"live"},
		`{"name": "live_2"}`:           {"live_2"},
		`{"options.viewOn": "live_1"}`: {"live"},
	} {
		var f bson.D
		if err := bson.UnmarshalExtJSON([]byte(filter), false, &f); err != nil {
			t.Fatal(err)
		}
		names, err := db.ListCollectionNames(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		if !slices.Equal(names, want) {
			t.Errorf("listCollections %s: %v, want %v", filter, names, want)
		}
	}

	_, err = view.InsertOne(ctx, bson.D{{Key: "_id", Value: "z"}})
	wantCode(t, "insert into the view", err, codeViewNotSupport)
	_, err = view.UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}})
	wantCode(t, "update of the view", err, codeViewNotSupport)
	_, err = view.DeleteOne(ctx, bson.D{{Key: "_id", Value: "a"}})
	wantCode(t, "delete from the view", err, codeViewNotSupport)
	_, err = view.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "coll", Value: 1}}})
	wantCode(t, "createIndexes on the view", err, codeViewNotSupport)
	_, err = view.Indexes().List(ctx)
	wantCode(t, "listIndexes on the view", err, codeViewNotSupport)
	wantCode(t, "a second create of the view", db.CreateView(ctx, "live", "live_2", bson.A{}), codeNamespaceExists)
	wantCode(t, "a collection under the view's name", db.CreateCollection(ctx, "live"), codeNamespaceExists)
	wantCode(t, "a view under a collection's name", db.CreateView(ctx, "live_2", "live_1", bson.A{}), codeNamespaceExists)
	wantCode(t, "a view with a pipeline", db.CreateView(ctx, "other", "live_1", mongo.Pipeline{{{Key: "$match", Value: bson.D{}}}}), codeNotImplemented)
	_, err = db.Collection(viewsCollection).DeleteMany(ctx, bson.D{})
	wantCode(t, "a write to system.views", err, codeInvalidNS)
	if got := idsOf(view.Find(ctx, bson.D{})); len(got) != 5 {
		t.Errorf("refused writes changed the view: %v", got)
	}

	repoint := bson.D{{Key: "collMod", Value: "live"}, {Key: "viewOn", Value: "live_2"}, {Key: "pipeline", Value: bson.A{}}}
	if err := db.RunCommand(ctx, repoint).Err(); err != nil {
		t.Fatalf("collMod: %v", err)
	}
	if got := idsOf(view.Find(ctx, bson.D{})); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("find after collMod: %v", got)
	}

	// Across a restart: the views are read back from system.views.
	_ = c.Disconnect(context.Background())
	_ = s.Close()
	_, c = startStore(t, dir)
	db = c.Database("views")
	view = db.Collection("live")
	if got := idsOf(view.Find(ctx, bson.D{})); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("find after a restart: %v", got)
	}

	if err := view.Drop(ctx); err != nil {
		t.Fatalf("drop the view: %v", err)
	}
	if got := idsOf(view.Find(ctx, bson.D{})); len(got) != 0 {
		t.Errorf("find after the drop: %v, want nothing", got)
	}
	if names, err := db.ListCollectionNames(ctx, bson.D{{Key: "type", Value: "view"}}); err != nil || len(names) != 0 {
		t.Errorf("views after the drop: %v, %v", names, err)
	}
	if n, err := db.Collection("live_2").CountDocuments(ctx, bson.D{}); err != nil || n != 2 {
		t.Errorf("the collection the view showed after its drop: %d documents, %v", n, err)
	}
}
