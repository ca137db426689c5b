// Package storetest gives tests real servers: a MongoDB database and a NATS
// JetStream connection. With MONGODB_URI or NATS_URL set they point at
// those servers; otherwise they start the embedded FerretDB (one per test
// binary, on a temp dir; in a process of its own when the test binary runs
// under the race detector) and an embedded NATS server (one per test, port
// -1). Every test gets its own database, dropped in cleanup. It also holds
// the event store conformance suite (RunConformance) and the change-stream
// suite (RunChangeStream).
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/internal/embedded"
	"github.com/orderd/orderd/internal/tcpproxy"
	"github.com/orderd/orderd/mongodb"
)

// MongoURI returns MONGODB_URI, or the URI of the test binary's embedded
// FerretDB, started on first use with its files in a temp dir. Under the
// race detector it runs beside the test binary (StartStoreProcess), which
// removes the dir when the test binary ends, unless
// ORDERD_TEST_STORE=inprocess; in-process the dir is left to the OS to
// clean (a package without TestMain has no exit hook). Either way it
// serves the store's test commands (embedded.WithTestCommands), which the
// change-stream suite uses.
func MongoURI(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("MONGODB_URI"); u != "" {
		return u
	}
	uri, err := sharedStore()
	if err != nil {
		t.Fatalf("embedded store: %v", err)
	}
	return uri
}

// sharedStore starts the test binary's store on first use (see MongoURI).
var sharedStore = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "orderd-store-")
	if err != nil {
		return "", err
	}
	uri, _, err := startStore(dir, true)
	return uri, err
})

// Client returns a connected client for MongoURI with the service's client
// options (mongodb.ClientOptions: majority writes and reads),
// disconnected in cleanup. It sets no client-side operation timeout, as the service does not: with
// one, the driver sends each command a maxTimeMS of the timeout less its
// round-trip estimate, and on an embedded store starved by a loaded test
// run FerretDB interrupted a plain find under it. Tests bound their calls
// with their contexts and go test -timeout.
func Client(t testing.TB) *mongo.Client {
	t.Helper()
	return dial(t, mongodb.ClientOptions(MongoURI(t)).SetServerSelectionTimeout(30*time.Second))
}

// dial connects a client with opts, disconnected when the test ends.
func dial(t testing.TB, opts *options.ClientOptions) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(opts)
	if err != nil {
		t.Fatalf("connect store: %v", err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// HeldClient returns a client of the test's store (MongoURI) whose
// connections pass through a tcpproxy.Proxy, and the proxy; the client is
// disconnected when the test ends.
func HeldClient(t testing.TB) (*mongo.Client, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(MongoURI(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.New(t, "127.0.0.1:0", u.Host)
	u.Host = proxy.Addr
	return dial(t, mongodb.ClientOptions(u.String())), proxy
}

// Database returns a new, uniquely named database, dropped in cleanup.
func Database(t testing.TB) *mongo.Database {
	t.Helper()
	db := Client(t).Database(Unique("t_"))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = db.Drop(ctx)
	})
	return db
}

// NATS is a JetStream connection for a test (its NATS connection is
// JS.Conn()), with the server when it is an embedded one (nil on NATS_URL).
type NATS struct {
	URL    string
	JS     jetstream.JetStream
	Server *server.Server
}

// StartNATS connects to NATS_URL, or starts an embedded NATS server with
// JetStream on a free loopback port and a temp dir. Both are closed in
// cleanup. On NATS_URL, callers must use stream and consumer names unique to
// the test (see Unique).
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	n := &NATS{URL: os.Getenv("NATS_URL")}
	if n.URL == "" {
		ns, err := embedded.StartNATS(t.TempDir(), "127.0.0.1", -1)
		if err != nil {
			t.Fatalf("embedded nats: %v", err)
		}
		t.Cleanup(ns.Shutdown)
		n.Server, n.URL = ns, ns.ClientURL()
	}
	n.JS = bustest.ConnectTo(t, n.URL)
	return n
}

// NewStream creates a JetStream stream with a unique name on n, deleted in
// cleanup, and returns its configuration. Its subjects are
// "orders.events.<stream id>", stored by partition (of partitions; 0 for
// none) as bus.StreamConfig maps them; on a shared server (NATS_URL) the
// prefix gets a unique first token so streams of concurrent tests do not
// overlap.
func NewStream(t testing.TB, n *NATS, partitions int) bus.StreamConfig {
	t.Helper()
	cfg := bus.StreamConfig{
		Name:          Unique("ORDERS_"),
		SubjectPrefix: "orders.events",
		Replicas:      1,
		Duplicates:    2 * time.Minute,
		Partitions:    partitions,
	}
	if n.Server == nil {
		cfg.SubjectPrefix = Unique("t") + ".orders.events"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStream(ctx, n.JS, cfg); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.JS.DeleteStream(ctx, cfg.Name)
	})
	return cfg
}

// Unique returns prefix plus a random suffix of eight lowercase hex
// digits, for names that must not clash on shared external servers.
func Unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// OpenStore returns a Store on a fresh test database (see Database), its
// indexes ensured twice (the second call must change nothing), and the
// database: a NewStore of the conformance suite.
func OpenStore(t testing.TB, opts ...mongodb.EventStoreOption) (*mongodb.EventStore, *mongo.Database) {
	t.Helper()
	db := Database(t)
	s := mongodb.NewEventStore(db, opts...)
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatalf("ensure indexes: %v", err)
	}
	if err := s.EnsureIndexes(t.Context()); err != nil {
		t.Fatalf("ensure indexes again: %v", err)
	}
	return s, db
}

// Connect opens a client of the test's own with opts (the caller applies
// MongoURI and, say, a command monitor), disconnected when the test ends,
// and returns a fresh database of it (see Database).
func Connect(t testing.TB, opts *options.ClientOptions) *mongo.Database {
	t.Helper()
	return dial(t, opts).Database(Database(t).Name())
}
