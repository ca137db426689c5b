package main

import (
	"context"
	"fmt"
	"maps"
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
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestUpgradeBuildsTheDailySalesRollup starts the service on a store and
// a stream as the previous versions left them: daily sales summed on read
// from the summaries (no daily_sales pointer, collection or consumer),
// customer_order_stats's collection, pointer and consumers, and the
// projectors' partition leases and members. The daily sales rollup is
// built from the log while orders keep coming. From the first answer on,
// every customer's stats and the daily sales of the imported orders are
// what they were before the upgrade (no 404, no partial sum), while the
// rollup builds and once it answers; the orders placed during the build
// are each counted once. What the retired projection left is removed:
// its consumers at once (no process of it is alive), the leases and
// members at start, its collection once the grace is over.
func TestUpgradeBuildsTheDailySalesRollup(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	n := storetest.StartNATS(t) // before the instances: its cleanup runs after they closed
	start := func(id string) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Mongo.URI, c.Mongo.Database, c.NATS.URL, c.InstanceID = storeURI, db.Name(), n.URL, id
			c.Jobs.Grace = time.Second
			// The build's cut and scan wait this margin each.
			c.Relay.CatchUpMargin = time.Second
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
			CustomerID string        `json:"customer_id"`
			PlacedAt   time.Time     `json:"placed_at"`
			Status     domain.Status `json:"status"`
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
	salesPath := fmt.Sprintf("/v1/daily-sales?from=%s&to=%s", first.UTC().Format(time.DateOnly), last.UTC().Format(time.DateOnly))
	want[salesPath] = ""
	for path := range want {
		want[path] = string(ca.must(http.StatusOK, "GET", path, "").Body)
	}
	// The rollup answers the daily sales and may still be behind the
	// summaries: its answer is taken once it counts every order of the
	// page, placed, canceled and unavailable.
	counts := func(placed, canceled, unavailable int64) string {
		return fmt.Sprintf("%d placed, %d canceled, %d unavailable", placed, canceled, unavailable)
	}
	var wantCanceled, wantUnavailable int64
	for _, o := range page.Items {
		switch o.Status {
		case domain.StatusCanceled:
			wantCanceled++
		case domain.StatusUnavailable:
			wantUnavailable++
		}
	}
	wantCounts, gotCounts := counts(int64(len(page.Items)), wantCanceled, wantUnavailable), ""
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		var sales struct{ Days []domain.DailySales }
		r := ca.must(http.StatusOK, "GET", salesPath, "")
		r.decode(t, &sales)
		var placed, canceled, unavailable int64
		for _, d := range sales.Days {
			placed, canceled, unavailable = placed+d.OrdersPlaced, canceled+d.OrdersCanceled, unavailable+d.OrdersUnavailable
		}
		want[salesPath], gotCounts = string(r.Body), counts(placed, canceled, unavailable)
		return gotCounts == wantCounts
	}) {
		t.Fatalf("the daily sales before the upgrade count %s, want %s", gotCounts, wantCounts)
	}
	stream := a.Config.Stream
	partitions := a.Config.Projector.Partitions
	closeMain(t, a)

	// The previous version kept no daily sales of its own.
	sales := projection.DailySales
	if _, err := db.Collection(mongodb.PointersCollection).DeleteOne(ctx, bson.D{{Key: "_id", Value: sales.Name}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Collection(sales.Collection).Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.JS.DeleteConsumer(ctx, stream.Name, "proj_"+sales.Key()); err != nil {
		t.Fatal(err)
	}
	// The retired projection as an earlier version left it.
	retired := map[string]int{"customer_order_stats": 2}
	if !slices.Equal(slices.Sorted(maps.Keys(retired)), projection.Retired) {
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
	// Orders placed while the rollup builds, every third one canceled:
	// its cancellation counts on the day of its placement.
	var (
		placed []string
		stop   = make(chan struct{})
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("during-upgrade-%03d", i)
			if r := cb.do("POST", "/v1/orders", fmt.Sprintf(
				`{"order_id":%q,"customer_id":"upgrade-customer","currency":"EUR","items":[{"sku":"s","quantity":%d,"unit_price_cents":250}]}`, id, 1+i%3)); r.Status != http.StatusCreated {
				t.Errorf("place %s: %v", id, r)
				return
			}
			placed = append(placed, id)
			if i%3 == 2 {
				if r := cb.do("POST", "/v1/orders/"+id+"/cancel", `{"reason":"upgrade test"}`); r.Status != http.StatusOK {
					t.Errorf("cancel %s: %v", id, r)
					return
				}
			}
		}
	}()
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
	built := func() bool {
		var p projection.Pointer
		err := db.Collection(mongodb.PointersCollection).FindOne(ctx, bson.D{{Key: "_id", Value: sales.Name}}).Decode(&p)
		return err == nil && p.ActiveVer() == sales.Ver() && strings.HasPrefix(p.Active, sales.Key()+"_") && p.Broken == ""
	}
	readAll()
	if !waitFor(2*time.Minute, 50*time.Millisecond, func() bool {
		readAll()
		return t.Failed() || (built() && leftovers(t, ctx, db, n.JS, stream.Name, retired) == "")
	}) {
		t.Fatalf("after two minutes: rollup built %v; the retired projection left: %s", built(), leftovers(t, ctx, db, n.JS, stream.Name, retired))
	}
	readAll() // from the rollup
	close(stop)
	<-done
	if len(placed) == 0 {
		t.Fatal("no order placed during the build")
	}
	f := projectiontest.LoadFixture(t, ctx, mongodb.NewEventStore(db), placed)
	var diff error
	if !waitFor(time.Minute, 100*time.Millisecond, func() bool {
		diff = projectiontest.DiffReadModels(ctx, db, f)
		return diff == nil
	}) {
		t.Fatalf("the orders placed during the build: %v", diff)
	}
	t.Logf("%d reads, all as before the upgrade; %d orders placed during the build, each counted once", reads.Load(), len(placed))
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
