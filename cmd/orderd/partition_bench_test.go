package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/internal/freeport"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// Sizes of BenchmarkProjectionScaling.
const (
	scaleOrders  = 600 // 4 events each: 2400 events, applied by the projection
	scaleUpdates = 4800
	scaleClients = 16
)

// BenchmarkProjectionScaling measures, against one embedded store and NATS
// server that the benchmark process owns, in one run:
//
//  1. the store's raw update rate: updateOne by _id ($set of two fields)
//     on a scratch collection of 600 documents, from 16 goroutines;
//  2. the projection apply rate with 1, 2 and 3 projector processes
//     (orderd serve -roles projector): for each count, a fresh database
//     and stream, the processes started and pulling the projection's 16
//     partitions, then 600 orders' 2400 events published at once; the rate is the events applied by the projection (2400)
//     over the time from the first publish until every partition's
//     consumer has acknowledged everything.
//
// Every process writes through the same store, whose writes run one at a
// time (its funnel) on a machine whose cores the processes share: the
// curve shows how far partitions spread the work before the store is the
// limit. Run it with -benchtime 1x (make bench).
func BenchmarkProjectionScaling(b *testing.B) {
	dir := b.TempDir()
	storeAddr := fmt.Sprintf("127.0.0.1:%d", freeport.Port(b))
	store, err := embedded.StartStore(filepath.Join(dir, "store"), storeAddr, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	natsPort := freeport.Port(b)
	ns, err := embedded.StartNATS(filepath.Join(dir, "nats"), "127.0.0.1", natsPort)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	uri, natsURL := "mongodb://"+storeAddr+"/", fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	js := bustest.ConnectTo(b, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	b.ResetTimer()
	raw := rawUpdates(ctx, b, client.Database("bench_raw").Collection("docs"))
	rates := map[int]float64{}
	for _, procs := range []int{1, 2, 3} {
		rates[procs] = applyRate(ctx, b, client, js, uri, natsURL, procs)
	}
	b.StopTimer()

	b.ReportMetric(raw, "raw_updates/s")
	var t strings.Builder
	fmt.Fprintf(&t, "\nBenchmarkProjectionScaling: embedded FerretDB 1.24 on SQLite + embedded NATS, 16 partitions\n")
	fmt.Fprintf(&t, "  %-52s %12.0f /s\n", "raw updateOne by _id, 16 goroutines", raw)
	for _, procs := range []int{1, 2, 3} {
		b.ReportMetric(rates[procs], fmt.Sprintf("applied/s_%dproc", procs))
		fmt.Fprintf(&t, "  %-52s %12.0f /s  (%.2f of raw, %.2fx one process)\n",
			fmt.Sprintf("projection apply rate, %d projector process(es)", procs), rates[procs], rates[procs]/raw, rates[procs]/rates[1])
	}
	fmt.Fprint(os.Stdout, t.String())
}

// rawUpdates inserts scaleOrders documents into coll, then updates them by
// _id scaleUpdates times from scaleClients goroutines, and returns the
// updates per second.
func rawUpdates(ctx context.Context, b *testing.B, coll *mongo.Collection) float64 {
	b.Helper()
	_ = coll.Drop(ctx)
	for i := range scaleOrders {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("o-%04d", i)}, {Key: "version", Value: int64(0)}}); err != nil {
			b.Fatal(err)
		}
	}
	var failed atomic.Int64
	start := time.Now()
	parallel(ctx, scaleUpdates, scaleClients, func(i int) {
		_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("o-%04d", i%scaleOrders)}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: int64(i)}, {Key: "status", Value: "shipped"}}}})
		if err != nil && failed.Add(1) <= 3 {
			b.Errorf("raw update %d: %v", i, err)
		}
	})
	return float64(scaleUpdates) / time.Since(start).Seconds()
}

// scaleProjections is how many projections the service runs, each
// applying every event: order_summaries.
const scaleProjections = 1

// applyRate starts procs projector processes on a fresh database and
// stream, waits until they all pull the partitions, publishes
// scaleOrders orders' events and returns the events applied per second
// (by the projection) until every partition consumer has acknowledged
// everything.
func applyRate(ctx context.Context, b *testing.B, client *mongo.Client, js jetstream.JetStream, uri, natsURL string, procs int) float64 {
	b.Helper()
	dbName, streamName := fmt.Sprintf("scale_%d", procs), fmt.Sprintf("SCALE_%d", procs)
	db := client.Database(dbName)
	cfg := bus.StreamConfig{Name: streamName, SubjectPrefix: subjectPrefix, Duplicates: time.Minute, Partitions: projector.DefaultPartitions}
	if err := bus.EnsureStream(ctx, js, cfg); err != nil {
		b.Fatal(err)
	}
	// The log first, none of it in the stream (the processes run no
	// relay; the events are published below, at once): the processes then
	// start on an empty stream. The read model's pointer before it, as a service started
	// on an empty log writes it (on a log it would build the read model first).
	es := mongodb.NewEventStore(db)
	if err := es.EnsureIndexes(ctx); err != nil {
		b.Fatal(err)
	}
	ps := mongodb.NewPointers(db)
	if err := ps.Ensure(ctx, projection.OrderSummaries.Name, projection.OrderSummaries.Collection, projection.OrderSummaries.Ver()); err != nil {
		b.Fatal(err)
	}
	svc := domain.NewService(es, nil)
	var events []domain.Event
	for i := range scaleOrders {
		id := fmt.Sprintf("scale-%d-%04d", procs, i)
		for _, c := range []domain.Command{
			domain.PlaceOrder{CustomerID: fmt.Sprintf("cust-%d", i%50), Currency: "BRL",
				Items: []domain.Line{{SKU: "sku-1", Quantity: 1, UnitPriceCents: 1990}}},
			domain.Approve{}, domain.Ship{}, domain.Deliver{},
		} {
			if _, err := svc.Execute(ctx, id, c, domain.ExecOptions{}); err != nil {
				b.Fatalf("%s: %T: %v", id, c, err)
			}
		}
		evs, err := es.Load(ctx, id, 0)
		if err != nil {
			b.Fatal(err)
		}
		events = append(events, evs...)
	}
	// The stream and processes go at the end of the round: the next
	// round's stream takes the same subjects.
	var started []*instance
	defer func() {
		for _, in := range started {
			in.kill()
		}
		if err := js.DeleteStream(context.WithoutCancel(ctx), streamName); err != nil {
			b.Errorf("delete stream %s: %v", streamName, err)
		}
	}()
	for i := range procs {
		name := fmt.Sprintf("projector-%d", i+1)
		started = append(started, startInstance(b, name, "-roles", "projector", "-instance-id", name, "-http-addr", "127.0.0.1:0",
			"-mongodb-uri", uri, "-mongodb-database", dbName, "-nats-url", natsURL, "-stream", streamName, "-log-level", "warn"))
	}
	// Every process pulling: JetStream pins each partition to one of
	// them as its first message arrives, and they even the shares out
	// from there.
	var members []projector.Member
	if !waitFor(2*time.Minute, 100*time.Millisecond, func() bool {
		var err error
		members, err = projector.RollCall(ctx, js.Conn(), projection.OrderSummaries.Key())
		return err == nil && len(members) == procs
	}) {
		b.Fatalf("%d projectors: %d answer the roll call", procs, len(members))
	}

	start := time.Now()
	if n, err := bus.NewPublisher(js, cfg).Republish(ctx, events); err != nil || n != len(events) {
		b.Fatalf("publish: %d of %d (%v)", n, len(events), err)
	}
	var lag uint64
	var err error
	if !waitFor(10*time.Minute, 50*time.Millisecond, func() bool {
		lag, err = streamLag(ctx, js, streamName)
		return err == nil && lag == 0
	}) {
		b.Fatalf("%d projectors: lag %d (%v) after 10 minutes", procs, lag, err)
	}
	elapsed := time.Since(start)
	n, err := db.Collection(projection.OrderSummaries.Collection).CountDocuments(ctx, bson.D{{Key: "version", Value: int64(4)}})
	if err != nil || n != scaleOrders {
		b.Errorf("%d projectors: %d summaries at version 4 (%v), want %d", procs, n, err, scaleOrders)
	}
	return float64(scaleProjections*len(events)) / elapsed.Seconds()
}

// streamLag sums, over the stream's consumers, the messages pending or
// awaiting acks; an error until every partition consumer of the
// projection exists.
func streamLag(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	var lag uint64
	n := 0
	for info := range s.ListConsumers(ctx).Info() {
		n++
		lag += info.NumPending + uint64(info.NumAckPending)
	}
	if n < scaleProjections*projector.DefaultPartitions {
		return 0, fmt.Errorf("%d consumers", n)
	}
	return lag, nil
}
