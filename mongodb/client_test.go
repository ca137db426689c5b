package mongodb_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
)

// commands records the commands a client sends, by name.
type commands struct {
	mu   sync.Mutex
	sent map[string][]bson.Raw
}

func (c *commands) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.sent[e.CommandName] = append(c.sent[e.CommandName], e.Command)
	}}
}

// TestClientOptionsKeepTheGuarantees: a URI that would read from
// secondaries, turn retries off or lower the concerns gets the service's
// settings back; the pool and server selection it may set.
func TestClientOptionsKeepTheGuarantees(t *testing.T) {
	o := mongodb.ClientOptions("mongodb://db1,db2/?replicaSet=rs0&readPreference=secondaryPreferred&retryWrites=false&retryReads=false&w=1&journal=false&readConcernLevel=local")
	if o.ReadPreference == nil || o.ReadPreference.Mode() != readpref.PrimaryMode {
		t.Errorf("read preference %v, want primary", o.ReadPreference)
	}
	if o.RetryWrites == nil || !*o.RetryWrites || o.RetryReads == nil || !*o.RetryReads {
		t.Errorf("retryWrites %v, retryReads %v, want both on", o.RetryWrites, o.RetryReads)
	}
	if o.WriteConcern == nil || o.WriteConcern.W != "majority" || o.WriteConcern.Journal == nil || !*o.WriteConcern.Journal {
		t.Errorf("write concern %+v, want w:majority, j:true", o.WriteConcern)
	}
	if o.ReadConcern == nil || o.ReadConcern.Level != "majority" {
		t.Errorf("read concern %+v, want majority", o.ReadConcern)
	}
	if o.MaxPoolSize == nil || *o.MaxPoolSize != mongodb.DefaultMaxPoolSize {
		t.Errorf("pool %v, want %d by default", o.MaxPoolSize, mongodb.DefaultMaxPoolSize)
	}
	if o := mongodb.ClientOptions("mongodb://db1/?maxPoolSize=50&serverSelectionTimeoutMS=2000"); *o.MaxPoolSize != 50 || *o.ServerSelectionTimeout != 2*time.Second {
		t.Errorf("the URI's pool %d and server selection %v, want 50 and 2s", *o.MaxPoolSize, *o.ServerSelectionTimeout)
	}
}

// TestClientSendsMajorityConcerns: every write the event log, its leases
// and its readers send carries w:majority, j:true, and every read
// readConcern majority, whatever the server's defaults (a replica set
// whose default is w:1 would otherwise acknowledge appends a failover can
// roll back). The URI cannot weaken them.
func TestClientSendsMajorityConcerns(t *testing.T) {
	ctx := t.Context()
	rec := &commands{sent: map[string][]bson.Raw{}}
	db := storetest.Connect(t, mongodb.ClientOptions(storetest.MongoURI(t)+"?w=1&readConcernLevel=local").SetMonitor(rec.monitor()))
	s := mongodb.NewEventStore(db)
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	commit := storetest.NewCommit("ord-concern", 0, domain.OrderPlaced{CustomerID: "c-1", Currency: "EUR",
		Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 100}}})
	if _, err := s.Append(ctx, commit); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx, "ord-concern", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Scan(ctx, domain.ScanRange{}, func(domain.StreamEvents) error { return nil }); err != nil {
		t.Fatal(err)
	}
	lease := mongodb.NewLease(db, "concern", "me", time.Minute)
	for range 2 { // a claim, then a renewal
		if ok, err := lease.TryAcquire(ctx); !ok || err != nil {
			t.Fatalf("lease: %v, %v", ok, err)
		}
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, name := range []string{"insert", "update", "findAndModify"} {
		if len(rec.sent[name]) == 0 {
			t.Fatalf("no %s command was sent", name)
		}
		for _, cmd := range rec.sent[name] {
			w, _ := cmd.Lookup("writeConcern", "w").StringValueOK()
			j, _ := cmd.Lookup("writeConcern", "j").BooleanOK()
			if w != "majority" || !j {
				t.Errorf("%s sent writeConcern %s, want {w: majority, j: true}", name, cmd.Lookup("writeConcern"))
			}
		}
	}
	if len(rec.sent["find"]) == 0 {
		t.Fatal("no find command was sent")
	}
	for _, cmd := range rec.sent["find"] {
		if level, _ := cmd.Lookup("readConcern", "level").StringValueOK(); level != "majority" {
			t.Errorf("find sent readConcern %s, want {level: majority}", cmd.Lookup("readConcern"))
		}
	}
}

// TestReachability: a store whose every member fails its heartbeat is
// down at once for new requests, and requests in flight are cancelled
// with domain.ErrUnavailable as the cause; when it answers again it is up.
func TestReachability(t *testing.T) {
	dir := t.TempDir()
	store, err := embedded.StartStore(dir, "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := store.URI[len("mongodb://") : len(store.URI)-1]
	reach := mongodb.NewReachability()
	c, err := mongo.Connect(mongodb.ClientOptions(store.URI).SetServerMonitor(reach.ServerMonitor()).
		SetHeartbeatInterval(500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	if err := c.Ping(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if reach.Ready(t.Context()) != nil {
		t.Fatal("down while the store answers")
	}
	inFlight, done, err := reach.Bound(t.Context())
	if err != nil {
		t.Fatalf("bound while up: %v", err)
	}
	defer done()

	_ = store.Close()
	projectiontest.WaitFor(t, 30*time.Second, "the store is seen down", func() error {
		if reach.Ready(t.Context()) == nil {
			return errors.New("still seen up")
		}
		return nil
	})
	select {
	case <-inFlight.Done():
		if cause := context.Cause(inFlight); !errors.Is(cause, domain.ErrUnavailable) {
			t.Errorf("in-flight request cancelled with %v, want ErrUnavailable", cause)
		}
	default:
		t.Error("the request in flight was not cancelled when the store went down")
	}
	if _, _, err := reach.Bound(t.Context()); !errors.Is(err, domain.ErrUnavailable) {
		t.Errorf("bound while down: %v, want ErrUnavailable", err)
	}
	if err := reach.Ready(t.Context()); !errors.Is(err, domain.ErrUnavailable) {
		t.Errorf("ready while down: %v, want ErrUnavailable", err)
	}

	store, err = embedded.StartStore(dir, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	projectiontest.WaitFor(t, 30*time.Second, "the store is seen up again", func() error { return reach.Ready(t.Context()) })
	if _, done, err := reach.Bound(t.Context()); err != nil {
		t.Errorf("bound after the store came back: %v", err)
	} else {
		done()
	}
}

// TestReachabilityElectingIsReady: members that answer their heartbeats
// while none is primary (a replica set electing) leave the store ready:
// commands wait the election out, and the instance stays in the load
// balancer. Only every member failing makes it unready.
func TestReachabilityElectingIsReady(t *testing.T) {
	reach := mongodb.NewReachability()
	mon := reach.ServerMonitor()
	secondary := event.ServerDescription{Kind: "RSSecondary"}
	for _, member := range []string{"mongo-0:27017", "mongo-1:27017", "mongo-2:27017"} {
		mon.ServerHeartbeatSucceeded(&event.ServerHeartbeatSucceededEvent{ConnectionID: member + "[-1]", Reply: secondary})
	}
	if err := reach.Ready(t.Context()); err != nil {
		t.Fatalf("electing: %v, want ready", err)
	}
	for _, member := range []string{"mongo-0:27017", "mongo-1:27017"} {
		mon.ServerHeartbeatFailed(&event.ServerHeartbeatFailedEvent{ConnectionID: member + "[-2]"})
	}
	if err := reach.Ready(t.Context()); err != nil {
		t.Fatalf("one member answering: %v, want ready", err)
	}
	mon.ServerHeartbeatFailed(&event.ServerHeartbeatFailedEvent{ConnectionID: "mongo-2:27017[-2]"})
	if err := reach.Ready(t.Context()); !errors.Is(err, domain.ErrUnavailable) {
		t.Fatalf("every member failing: %v, want ErrUnavailable", err)
	}
}
