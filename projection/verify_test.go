package projection_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestVerifyWhenIDHashesCollide: with every document id under one key,
// Verify still reports exactly the drift (one missing, one different, one
// extra document) and a clean read model as clean.
func TestVerifyWhenIDHashesCollide(t *testing.T) {
	projection.CollideVerifyKeys(t)
	ctx := projectiontest.Context(t, 60*time.Second)
	es, db := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "vck", 6, 2)
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	if _, poison, err := p.Apply(ctx, f.Flat, false); err != nil || len(poison) > 0 {
		t.Fatalf("Apply: poison %v, err %v", poison, err)
	}
	coll := db.Collection(projection.OrderSummaries.Collection)
	clean, err := p.Verify(ctx, coll.Name(), es, false, nil)
	if err != nil || clean.Drift() != 0 || clean.Documents != 6 || clean.Streams != 6 {
		t.Fatalf("verify of a clean read model: %+v, %v", clean, err)
	}
	projectiontest.Must(t)(coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: f.IDs[1]}}))
	projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: f.IDs[4]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 1}}}}))
	projectiontest.Must(t)(coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "ghost"}, {Key: "version", Value: 1}, {Key: "status", Value: "created"}}))
	rep, err := p.Verify(ctx, coll.Name(), es, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != 1 || rep.Different != 1 || rep.Extra != 1 || rep.Stale != 0 || rep.Documents != 6 {
		t.Fatalf("missing %d different %d extra %d stale %d of %d documents, want 1 1 1 0 of 6", rep.Missing, rep.Different, rep.Extra, rep.Stale, rep.Documents)
	}
	var got []string
	for _, e := range rep.Examples {
		got = append(got, e.Kind+" "+e.ID)
	}
	slices.Sort(got)
	if want := []string{"different " + f.IDs[4], "extra ghost", "missing " + f.IDs[1]}; !slices.Equal(got, want) {
		t.Fatalf("examples %v, want %v", got, want)
	}
}
