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

	"github.com/orderd/orderd/admin"
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
// correlation id, one find, and a customer's stats or a range of daily
// sales one aggregation.
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
	es := projectiontest.NewLog(t, ctx, db)

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
			p, err := es.Browse(ctx, admin.LogQuery{Limit: 50, CorrelationID: keyed.Events[0].Metadata.CorrelationID})
			if err == nil && (len(p.Commits) != 1 || p.Commits[0].StreamID != keyed.StreamID || p.Next != "") {
				err = fmt.Errorf("page %+v, want the keyed commit alone", p)
			}
			return err
		}, map[string]int{"find": 1}},
		"the log's newest page": {func() error {
			p, err := es.Browse(ctx, admin.LogQuery{Limit: 3})
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
	// FerretDB 1.24 has neither a $max accumulator (the stats' newest
	// recorded_at) nor $dateToString (the day of placed_at): on the
	// embedded store the aggregations are sent, refused, and only counted.
	onMongoDB := os.Getenv("MONGODB_URI") != ""
	refusedOnFerretDB := func(err error) error {
		if !onMongoDB {
			return nil
		}
		return err
	}
	if _, err := r.CustomerStats(ctx, "cust-0"); refusedOnFerretDB(err) != nil { // reads the pointer once
		t.Fatal(err)
	}
	for customer, want := range f.ExpectedStats() {
		var got domain.CustomerOrderStats
		sent := counter.during(t, func() (err error) { got, err = r.CustomerStats(ctx, customer); return refusedOnFerretDB(err) })
		if !maps.Equal(sent, map[string]int{"aggregate": 1}) {
			t.Errorf("stats of %s sent %v, want one aggregate", customer, sent)
		}
		// The embedded store's own path is checked by every read-model test.
		if onMongoDB && !reflect.DeepEqual(got, want) {
			t.Errorf("stats of %s: %+v, want %+v", customer, got, want)
		}
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
