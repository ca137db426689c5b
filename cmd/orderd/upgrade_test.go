package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestUpgradeRetiresThePerOrderReadModels starts the service on a store
// and a stream as the version that kept customer_order_stats and
// daily_sales left them (their collections, pointers and consumers beside
// order_summaries, and the projectors' partition leases and members). From its first answer on, every
// customer's stats and the daily sales are what they were before the
// upgrade, summed from the summaries: no 404, no partial sum. What the
// retired projections left is removed: their consumers at once (no
// process of theirs is alive), the leases and members at start, their
// collections once the grace is over.
func TestUpgradeRetiresThePerOrderReadModels(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	n := storetest.StartNATS(t) // before the instances: its cleanup runs after they closed
	start := func(id string) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Mongo.URI, c.Mongo.Database, c.NATS.URL, c.InstanceID = storeURI, db.Name(), n.URL, id
			c.Jobs.Grace = time.Second
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	a := start("before-upgrade")
	rep, err := olist.Run(ctx, olist.Config{Data: "../../testdata/olist-sample", URL: "http://" + a.HTTPAddr,
		Concurrency: 8, Limit: 30, Timeout: 30 * time.Second})
	if err != nil || rep.Err() != nil {
		t.Fatalf("import: %v %v", err, rep.Err())
	}
	// What readers got before the upgrade, once the import was checked.
	ca := newClient(t, a)
	var page struct {
		Items []struct {
			CustomerID string    `json:"customer_id"`
			PlacedAt   time.Time `json:"placed_at"`
		} `json:"items"`
	}
	ca.must(http.StatusOK, "GET", "/v1/order-summaries?limit=500", "").decode(t, &page)
	if len(page.Items) != 30 {
		t.Fatalf("%d summaries, want 30", len(page.Items))
	}
	first, last := page.Items[0].PlacedAt, page.Items[0].PlacedAt
	want := map[string]string{} // path: body
	for _, o := range page.Items {
		want["/v1/customers/"+o.CustomerID+"/order-stats"] = ""
		first, last = minTime(first, o.PlacedAt), maxTime(last, o.PlacedAt)
	}
	want[fmt.Sprintf("/v1/daily-sales?from=%s&to=%s", first.UTC().Format(time.DateOnly), last.UTC().Format(time.DateOnly))] = ""
	for path := range want {
		want[path] = string(ca.must(http.StatusOK, "GET", path, "").Body)
	}
	stream := a.Config.Stream
	partitions := a.Config.Projector.Partitions
	closeMain(t, a)

	// The retired projections as the earlier version left them:
	// customer_order_stats at version 2, daily_sales at version 1.
	retired := map[string]int{"customer_order_stats": 2, "daily_sales": 1}
	if !slices.Equal(slices.Sorted(func(yield func(string) bool) {
		for k := range retired {
			if !yield(k) {
				return
			}
		}
	}), projection.Retired) {
		t.Fatalf("the test leaves %v, the service retires %v", retired, projection.Retired)
	}
	for name, v := range retired {
		key := projection.VersionKey(name, v)
		if _, err := db.Collection(name).InsertOne(ctx, bson.D{{Key: "_id", Value: "an-order"}, {Key: "version", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Collection(mongodb.PointersCollection).InsertOne(ctx, bson.D{{Key: "_id", Value: name},
			{Key: "active", Value: name}, {Key: "active_version", Value: v}, {Key: "generation", Value: int64(1)}}); err != nil {
			t.Fatal(err)
		}
		for p := range partitions {
			if _, err := n.JS.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{
				Durable: fmt.Sprintf("proj_%s_p%02d", key, p), FilterSubject: fmt.Sprintf("%s.%d.>", stream.SubjectPrefix, p),
				AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The projectors' partition leases and members, which this version
	// does not keep.
	for _, coll := range mongodb.Unused {
		if _, err := db.Collection(coll).InsertOne(ctx, bson.D{{Key: "_id", Value: "order_summaries/00"}}); err != nil {
			t.Fatal(err)
		}
	}

	b := start("after-upgrade")
	cb := newClient(t, b)
	var reads atomic.Int64
	readAll := func() {
		for path, body := range want {
			r := cb.do("GET", path, "")
			reads.Add(1)
			if r.Status != http.StatusOK || !jsonEqual([]byte(body), r.Body) {
				t.Errorf("GET %s after the upgrade: %v, want 200 %s", path, r, body)
			}
		}
	}
	readAll()
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool {
		readAll()
		return t.Failed() || leftovers(t, ctx, db, n.JS, stream.Name, retired) == ""
	}) {
		t.Fatalf("after a minute the retired projections left: %s", leftovers(t, ctx, db, n.JS, stream.Name, retired))
	}
	t.Logf("%d reads, all as before the upgrade", reads.Load())
}

// leftovers describes what the retired projections still have: a
// pointer, a collection or a consumer, and the collections of partition
// leases and members ("" for nothing).
func leftovers(t *testing.T, ctx context.Context, db *mongo.Database, js jetstream.JetStream, stream string, retired map[string]int) string {
	t.Helper()
	var left []string
	colls, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return err.Error()
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err.Error()
	}
	var consumers []string
	names := st.ConsumerNames(ctx)
	for c := range names.Name() {
		consumers = append(consumers, c)
	}
	if err := names.Err(); err != nil {
		return err.Error()
	}
	for name, v := range retired {
		key := projection.VersionKey(name, v)
		if slices.Contains(colls, name) {
			left = append(left, "collection "+name)
		}
		if k, err := db.Collection(mongodb.PointersCollection).CountDocuments(ctx, bson.D{{Key: "_id", Value: name}}); err != nil || k > 0 {
			left = append(left, fmt.Sprintf("%d pointers of %s (%v)", k, name, err))
		}
		for _, c := range consumers {
			if strings.HasPrefix(c, "proj_"+key+"_") {
				left = append(left, "consumer "+c)
			}
		}
	}
	for _, coll := range mongodb.Unused {
		if slices.Contains(colls, coll) {
			left = append(left, "collection "+coll)
		}
	}
	return strings.Join(left, ", ")
}
