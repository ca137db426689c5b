package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestRebuildBatchMeetingLiveWritesWritesOnlyWhatIsBehind: a rebuild batch
// whose insert meets documents a live projector has already written into
// the shadow brings every document to at least its fold without going
// back, in two write commands: the unordered insert of the batch, then one
// bulk write of version-guarded replacements for the documents it met,
// which changes only those missing or behind. The batch, in this order:
// two streams nobody wrote, one written live up to the fold, one written
// live past what the scan read, one written live behind the fold, and one
// more nobody wrote.
func TestRebuildBatchMeetingLiveWritesWritesOnlyWhatIsBehind(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const shadow = "order_summaries_shadow"
	var (
		mu     sync.Mutex
		writes = map[string]int{}
	)
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		switch e.CommandName {
		case "insert", "update", "findAndModify", "delete":
			if coll, _ := e.Command.Lookup(e.CommandName).StringValueOK(); coll == shadow {
				mu.Lock()
				writes[e.CommandName]++
				mu.Unlock()
			}
		}
	}}
	db := storetest.Connect(t, mongodb.ClientOptions(storetest.MongoURI(t)).SetMonitor(mon))
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}

	order := []string{"new-1", "new-2", "live-even", "live-ahead", "live-behind", "new-3"}
	logs := map[string][]domain.Event{}
	for _, id := range order {
		c := storetest.NewCommit(id, 0,
			domain.OrderPlaced{CustomerID: "cust-1", Currency: "BRL", Items: []domain.Line{{SKU: "sku-1", Quantity: 1, UnitPriceCents: 990}}},
			domain.OrderApproved{}, domain.OrderShipped{})
		if _, err := es.Append(ctx, c); err != nil {
			t.Fatal(err)
		}
		evs, err := es.Load(ctx, id, 0)
		if err != nil || len(evs) != 3 {
			t.Fatalf("load %s: %d events, %v", id, len(evs), err)
		}
		logs[id] = evs
	}
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	live := p.ReadModel(shadow)
	for id, n := range map[string]int{"live-even": 3, "live-ahead": 3, "live-behind": 1} {
		if _, _, err := live.Apply(ctx, logs[id][:n]); err != nil {
			t.Fatalf("live write of %s: %v", id, err)
		}
	}

	var batch []domain.StreamEvents
	for _, id := range order {
		evs := logs[id]
		if id == "live-ahead" {
			evs = evs[:2] // the scan read the stream before its last commit
		}
		batch = append(batch, domain.StreamEvents{StreamID: id, Events: evs, Commits: 1})
	}
	mu.Lock()
	clear(writes)
	mu.Unlock()
	if _, err := p.WriteFolds(ctx, shadow, batch); err != nil {
		t.Fatalf("WriteFolds: %v", err)
	}

	for _, id := range order {
		want, _, err := projection.OrderSummaries.Fold(logs[id])
		if err != nil {
			t.Fatal(err)
		}
		docs, err := mongodb.NewDocuments[domain.Order](db).Load(ctx, shadow, []string{id})
		got, ok := docs[id]
		if err != nil || !ok {
			t.Fatalf("%s: found %v, %v", id, ok, err)
		}
		gh, _ := projection.DocHash(got)
		wh, _ := projection.DocHash(want)
		if gh != wh {
			t.Errorf("%s after the batch: %+v, want the fold of its log %+v", id, got, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	// The insert of the batch; then the documents it met, in one bulk
	// write through the version guard.
	if writes["insert"] != 1 || writes["update"] != 1 || writes["findAndModify"] != 0 || writes["delete"] != 0 {
		t.Errorf("write commands on the shadow: %v, want 1 insert and 1 update", writes)
	}
}
