package projection_test

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestVerifySumsFindsWhatDiffersFromTheScan scans a log into a shadow
// with WriteFolds, the batch written twice as a scan retried from its
// cursor writes it (the first time with one stream read before its last
// commit), and checks the shadow against the recorded sums: the retry
// replaced the sum it met, a clean shadow verifies clean without a log
// scan, and a deleted, a changed and an extra document, and a changed
// document whose sum is gone, are each reported, also when every id
// shares one key in memory.
func TestVerifySumsFindsWhatDiffersFromTheScan(t *testing.T) {
	for _, collide := range []bool{false, true} {
		t.Run(map[bool]string{false: "distinct keys", true: "colliding keys"}[collide], func(t *testing.T) {
			if collide {
				projection.CollideVerifyKeys(t)
			}
			ctx := projectiontest.Context(t, 60*time.Second)
			es, db := storetest.OpenStore(t)
			f := projectiontest.NewFixture(t, ctx, es, "vsm", 6, 2)
			p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
			const shadow = "order_summaries_sums_test"
			var batch []domain.StreamEvents
			if err := es.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
				batch = append(batch, st)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			short := slices.Clone(batch)
			short[2].Events = short[2].Events[:len(short[2].Events)-1]
			for _, b := range [][]domain.StreamEvents{short, batch} {
				if _, err := p.WriteFolds(ctx, shadow, b); err != nil {
					t.Fatalf("WriteFolds: %v", err)
				}
			}
			sums := db.Collection(projection.SumsCollection(shadow))
			var sum struct {
				Version int64  `bson:"version"`
				Hash    []byte `bson:"hash"`
			}
			if err := sums.FindOne(ctx, bson.D{{Key: "_id", Value: batch[2].StreamID}}).Decode(&sum); err != nil {
				t.Fatal(err)
			}
			if want := int64(len(batch[2].Events)); sum.Version != want || len(sum.Hash) != 32 {
				t.Errorf("sum of %s after the retried batch: version %d, %d hash bytes; want %d and 32", batch[2].StreamID, sum.Version, len(sum.Hash), want)
			}

			clean, err := p.VerifySums(ctx, shadow, false, nil)
			if err != nil || clean.Drift() != 0 || clean.Documents != 6 || clean.Streams != 6 || clean.Digest != clean.ExpectedDigest {
				t.Fatalf("verify of a clean shadow: %+v, %v", clean, err)
			}

			coll := db.Collection(shadow)
			projectiontest.Must(t)(coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: f.IDs[1]}}))
			projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: f.IDs[4]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 1}}}}))
			projectiontest.Must(t)(coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: f.IDs[5]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "total_cents", Value: 2}}}}))
			projectiontest.Must(t)(sums.DeleteOne(ctx, bson.D{{Key: "_id", Value: f.IDs[5]}}))
			projectiontest.Must(t)(coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "ghost"}, {Key: "version", Value: 1}, {Key: "status", Value: "created"}}))
			rep, err := p.VerifySums(ctx, shadow, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Missing != 1 || rep.Different != 2 || rep.Extra != 1 || rep.Stale != 0 || rep.Documents != 6 || rep.Streams != 5 || rep.Digest == rep.ExpectedDigest {
				t.Fatalf("missing %d different %d extra %d stale %d of %d documents and %d sums, digests equal %v; want 1 2 1 0 of 6 and 5, unequal",
					rep.Missing, rep.Different, rep.Extra, rep.Stale, rep.Documents, rep.Streams, rep.Digest == rep.ExpectedDigest)
			}
			var got []string
			for _, e := range rep.Examples {
				got = append(got, e.Kind+" "+e.ID)
			}
			slices.Sort(got)
			if want := []string{"different " + f.IDs[4], "different " + f.IDs[5], "extra ghost", "missing " + f.IDs[1]}; !slices.Equal(got, want) {
				t.Fatalf("examples %v, want %v", got, want)
			}
		})
	}
}
