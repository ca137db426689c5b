package mongodb_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// commandCounter counts the commands a client sends, by name, as the
// driver's command monitor sees them.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		c.n[e.CommandName]++
		c.mu.Unlock()
	}}
}

// during returns the commands fn sent.
func (c *commandCounter) during(t *testing.T, fn func() error) map[string]int {
	t.Helper()
	c.mu.Lock()
	c.n = map[string]int{}
	c.mu.Unlock()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// TestMongoDBPathsRoundTrips counts the commands each operation sends on
// MongoDB's paths, so that a return to chains of look-ups or to a write
// per document fails: a stream of two commits is one find, an
// idempotency key one find, a batch of many streams into a cold read
// model one find and one bulk update, the same batch again (cached, all
// duplicates) nothing, a page of the log, of every commit or of one
// correlation id, one find, a customer's stats or page of summaries one
// find, and a range of daily sales one aggregation.
func TestMongoDBPathsRoundTrips(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	counter := &commandCounter{n: map[string]int{}}
	c, err := mongo.Connect(mongodb.ClientOptions(storetest.MongoURI(t)).SetMonitor(counter.monitor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	mongodb.UseDialect(c, mongodb.DialectMongoDB)
	db := c.Database(storetest.Database(t).Name())
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatalf("event store indexes: %v", err)
	}

	const streams = 12
	f := projectiontest.NewFixture(t, ctx, es, "rt", streams, 3)
	id := f.IDs[1] // four events, two per commit
	key := storetest.Unique("key-")
	keyed := storetest.NewCommit(storetest.Unique("order-"), 0, domain.OrderPlaced{CustomerID: "c", Currency: "BRL",
		Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 1}}})
	keyed.IdempotencyKey = key
	if _, err := es.Append(ctx, keyed); err != nil {
		t.Fatal(err)
	}
	rm := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil)
	if err := rm.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]struct {
		fn   func() error
		want map[string]int
	}{
		"load a stream of two commits": {func() error {
			evs, err := es.Load(ctx, id, 0)
			if err == nil && len(evs) != len(f.Events[id]) {
				err = fmt.Errorf("loaded %d events, want %d", len(evs), len(f.Events[id]))
			}
			return err
		}, map[string]int{"find": 1}},
		"find an idempotency key": {func() error {
			_, err := es.FindIdempotencyKey(ctx, key, keyed.StreamID)
			return err
		}, map[string]int{"find": 1}},
		"a batch into a cold read model": {func() error {
			_, _, err := rm.Apply(ctx, f.Flat)
			return err
		}, map[string]int{"find": 1, "update": 1}},
		"the log's commits of one correlation id": {func() error {
			p, err := es.Browse(ctx, domain.LogQuery{Limit: 50, CorrelationID: keyed.Events[0].Metadata.CorrelationID})
			if err == nil && (len(p.Commits) != 1 || p.Commits[0].StreamID != keyed.StreamID || p.Next != "") {
				err = fmt.Errorf("page %+v, want the keyed commit alone", p)
			}
			return err
		}, map[string]int{"find": 1}},
		"the log's newest page": {func() error {
			p, err := es.Browse(ctx, domain.LogQuery{Limit: 3})
			if err == nil && (len(p.Commits) != 3 || p.Next == "") {
				err = fmt.Errorf("page %+v, want 3 commits and a cursor", p)
			}
			return err
		}, map[string]int{"find": 1}},
	} {
		if got := counter.during(t, tc.fn); !maps.Equal(got, tc.want) {
			t.Errorf("%s sent %v, want %v", name, got, tc.want)
		}
	}
	if got := counter.during(t, func() error { _, _, err := rm.Apply(ctx, f.Flat); return err }); len(got) != 0 {
		t.Errorf("a batch the read model already reflects sent %v, want nothing", got)
	}

	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	if _, err := r.CustomerStats(ctx, "cust-0"); err != nil { // reads the pointer once
		t.Fatal(err)
	}
	for customer, want := range f.ExpectedStats() {
		var got domain.CustomerOrderStats
		sent := counter.during(t, func() (err error) { got, err = r.CustomerStats(ctx, customer); return err })
		if !maps.Equal(sent, map[string]int{"find": 1}) {
			t.Errorf("stats of %s sent %v, want one find", customer, sent)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("stats of %s: %+v, want %+v", customer, got, want)
		}
		var page []domain.Order
		sent = counter.during(t, func() (err error) { page, err = r.ListSummaries(ctx, customer, "", "", 50); return err })
		if !maps.Equal(sent, map[string]int{"find": 1}) || int64(len(page)) != want.OrderCount {
			t.Errorf("page of %s sent %v and held %d summaries, want one find and %d", customer, sent, len(page), want.OrderCount)
		}
	}

	// FerretDB 1.24 has no $dateToString (the day of placed_at): on the
	// embedded store the aggregation is sent, refused, and only counted.
	onMongoDB := os.Getenv("MONGODB_URI") != ""
	refusedOnFerretDB := func(err error) error {
		if !onMongoDB {
			return nil
		}
		return err
	}
	want, first, last := f.ExpectedDailySales()
	from, _ := time.Parse(time.DateOnly, first)
	to, _ := time.Parse(time.DateOnly, last)
	var got []domain.DailySales
	sent := counter.during(t, func() (err error) { got, _, err = r.DailySales(ctx, from, to, ""); return refusedOnFerretDB(err) })
	if !maps.Equal(sent, map[string]int{"aggregate": 1}) {
		t.Errorf("daily sales sent %v, want one aggregate", sent)
	}
	if onMongoDB && !reflect.DeepEqual(got, want) {
		t.Errorf("daily sales %+v, want %+v", got, want)
	}
}

// TestCustomerStatsInPages: a customer with more summaries than a read of
// the stats takes is read in pages, each after the last _id of the one
// before, and summed whole: 4 orders in pages of 3 are two finds, in
// pages of 2 three (the last one empty).
func TestCustomerStatsInPages(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	counter := &commandCounter{n: map[string]int{}}
	c, err := mongo.Connect(mongodb.ClientOptions(storetest.MongoURI(t)).SetMonitor(counter.monitor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	db := c.Database(storetest.Database(t).Name())
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatalf("event store indexes: %v", err)
	}
	f := projectiontest.NewFixture(t, ctx, es, "pg", 12, 3)
	rm := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil)
	if err := rm.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rm.Apply(ctx, f.Flat); err != nil {
		t.Fatal(err)
	}
	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	if _, err := r.CustomerStats(ctx, "cust-0"); err != nil { // reads the pointer once
		t.Fatal(err)
	}
	want := f.ExpectedStats()["cust-1"]
	for page, finds := range map[int]int{3: 2, 2: 3} {
		mongodb.SetStatsPage(r, page)
		var got domain.CustomerOrderStats
		sent := counter.during(t, func() (err error) { got, err = r.CustomerStats(ctx, "cust-1"); return err })
		if !maps.Equal(sent, map[string]int{"find": finds}) || !reflect.DeepEqual(got, want) {
			t.Errorf("pages of %d: sent %v, stats %+v; want %d finds, %+v", page, sent, got, finds, want)
		}
	}
}
