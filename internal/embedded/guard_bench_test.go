package embedded

import (
	"fmt"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkReplaceRows times bulks of 32 guarded replacements of stored
// 1 KB documents (5,000 in the collection, indexed on a customer as the
// summaries are): "rows" as the funnel writes them (replaceRows), and
// "ferretdb" as FerretDB's update does, the same documents with _id
// last, which the funnel leaves to it (insertable).
func BenchmarkReplaceRows(b *testing.B) {
	_, c := startStore(b, b.TempDir())
	ctx := b.Context()
	coll := c.Database("bench").Collection("docs")
	doc := func(i int, v int64, idFirst bool) bson.D {
		id := bson.E{Key: "_id", Value: fmt.Sprintf("order-%05d", i)}
		d := bson.D{{Key: "version", Value: v}, {Key: "customer_id", Value: fmt.Sprintf("c%d", i%300)},
			{Key: "status", Value: "approved"}, {Key: "pad", Value: strings.Repeat("x", 900)}}
		if idFirst {
			return append(bson.D{id}, d...)
		}
		return append(d, id)
	}
	const stored, bulk = 5000, 32
	docs := make([]any, stored)
	for i := range docs {
		docs[i] = doc(i, 1, true)
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		b.Fatal(err)
	}
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "customer_id", Value: 1}, {Key: "_id", Value: 1}}}); err != nil {
		b.Fatal(err)
	}
	v := int64(1)
	for _, way := range []struct {
		name    string
		idFirst bool
	}{{"rows", true}, {"ferretdb", false}} {
		b.Run(way.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				v++
				models := make([]mongo.WriteModel, bulk)
				for k := range models {
					n := (i*bulk + k) % stored
					models[k] = mongo.NewReplaceOneModel().SetUpsert(true).SetReplacement(doc(n, v, way.idFirst)).
						SetFilter(bson.D{{Key: "_id", Value: fmt.Sprintf("order-%05d", n)}, {Key: "version", Value: bson.D{{Key: "$lt", Value: v}}}})
				}
				res, err := coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
				if err != nil || res.ModifiedCount != bulk {
					b.Fatalf("bulk: %+v, %v", res, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*bulk), "µs/stmt")
		})
	}
}
