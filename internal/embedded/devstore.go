// Package embedded runs the development servers in-process: FerretDB 1.24
// on SQLite (a MongoDB wire-protocol store) and a NATS server with
// JetStream. `orderd` uses it when no MONGODB_URI and no NATS_URL are set,
// and the tests use it when no external servers are named. Production
// binaries leave it out: cmd/orderd imports it only without the `noembed`
// build tag.
//
// The store keeps MongoDB's single-document guarantees through its write
// funnel (funnel.go: every write command of every client runs alone, so
// conditional updates are atomic) and indexes every collection's _id
// (index.go). What still differs from MongoDB, and how the service lives
// with it (docs/embedded-store.md):
//
//   - only a filter that is exactly {_id: v} reaches an index; any other
//     filter is evaluated in Go over the whole collection, and any sort but
//     $natural is done in memory: hot paths on the log and the read models
//     filter by _id only, and log scans sort commit ids, not commits;
//   - the count command decodes the whole collection, $collStats does not:
//     the log is counted from $collStats;
//   - writes run one at a time (SQLite has one writer), in arrival order;
//   - a duplicate-key error does not name the index;
//   - an unordered insert of several documents is answered as on MongoDB:
//     FerretDB writes them a hundred to a SQLite transaction and, when one
//     fails, writes that hundred again document by document, reporting
//     each duplicate key at its own index and n as the count stored
//     (internal/handler/msg_insert.go; TestUnorderedInsertAnswersAsMongoDB).
//     Only an error other than a duplicate key (a full disk) ends the
//     command with some documents stored, an outcome the client cannot
//     tell apart, as after a network error; and an ordered insert of more
//     than a hundred documents goes on past its first error;
//   - an update of several statements stops at its first error (the
//     funnel serves version-guarded ones itself, guard.go), and an update
//     command of more than 64 statements stalls;
//   - one createIndexes naming several existing indexes drops the
//     connection;
//   - no partial indexes; the funnel creates those that mean the same
//     without their filter as plain indexes: any non-unique one, and a
//     unique index filtered
//     by {f: {$exists: true}} on a field f of its key (the event log's
//     per-stream idempotency key index), since SQLite indexes a missing
//     field as NULL and never compares NULLs in a unique index
//     (withoutPartialFilters); FerretDB refuses every other filter;
//   - change streams of one collection's inserts only, served by the funnel
//     (changestream.go; FerretDB has none): the one stream the service
//     opens ({$match: {operationType: "insert"}}, from the end or after a
//     resumeAfter token), since the funnel sees no trace of an update or a
//     delete to report; any other stream or option is refused
//     (NotImplemented), never answered without them. Events are ordered,
//     and resume tokens made, by the SQLite rowid of the collection's table
//     with the collection's uuid, so they outlive a restart and a
//     re-created collection's token answers ChangeStreamHistoryLost; this
//     order is commit order only while the collection is insert-only (a
//     delete of the last rows lets SQLite reuse their rowids), as the event
//     log is. compact is refused: its VACUUM may renumber those rowids. An
//     event's document is the one the funnel saw inserted; after a
//     restart, or once out of its bounded cache, it is read back by its
//     _id (a string in the log) as stored now;
//   - no transactions, views, TTL indexes, Decimal128,
//     $group $max/$min, or a $group of several accumulators (only the
//     first sees the group's documents);
//   - write and read concerns are accepted and ignored: it is one node;
//   - a commit is durable against a crash of the process, not of the
//     machine: SQLite runs in WAL mode with synchronous=NORMAL, which
//     writes each transaction to the WAL and syncs it to disk at
//     checkpoints, not at every commit, so writes are faster than with
//     FULL (docs/embedded-store.md, "Durable against a crash of the
//     process"); a power loss may lose the
//     last commits, which a development store may (production runs
//     MongoDB with w:majority, j:true).
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"github.com/nats-io/nats-server/v2/server"
)

// Store is a running embedded FerretDB behind its write funnel.
type Store struct {
	// URI is the MongoDB connection string of the funnel's loopback
	// listener, the one address clients use.
	URI    string
	funnel *funnel
	index  *idIndex
	cancel context.CancelFunc
	done   chan struct{}
}

// WriteBusy returns how long the store's single writer has been busy since
// it started: the time some write held the funnel's connection. Its rise
// over a span of wall time is the store's busy fraction, which tells a
// figure bound by the store (near 1) from one bound by the service.
func (s *Store) WriteBusy() time.Duration { return s.funnel.slot.busyTime() }

// WriteCosts returns, by kind, how many writes the store ran since it
// started and how long they held its single writer: where WriteBusy's time
// went.
func (s *Store) WriteCosts() map[WriteKind]WriteCost { return s.funnel.costs.snapshot() }

// StartStore starts FerretDB on SQLite with its files in dir, and the
// funnel (funnel.go) listening on addr ("127.0.0.1:0" for any free port) in
// front of it: every client, in this process or another, reaches FerretDB
// through the funnel, which keeps MongoDB's single-document atomicity and
// indexes every collection's _id. FerretDB itself listens on a loopback
// port nobody else is told. StartStore returns once the funnel accepts
// connections. Options: WithTestCommands.
func StartStore(dir, addr string, log *slog.Logger, opts ...StoreOption) (*Store, error) {
	var o storeOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded store dir: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// temp_store(memory): an insert of several documents into a table
	// with unique indexes keeps a statement journal, by default in a temp
	// file; the pwrite calls to it were a large share of the store's CPU
	// under group-committed appends (docs/embedded-store.md, "Why SQLite's
	// temporary store is in memory").
	// It holds nothing a crash must keep: it undoes a failed statement
	// inside its transaction.
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: "file:" + abs + "/?_pragma=synchronous(normal)&_pragma=temp_store(memory)",
		Logger:    log,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{cancel: cancel, done: make(chan struct{}), index: newIDIndex(abs)}
	go func() {
		defer close(s.done)
		_ = f.Run(ctx)
	}()
	fail := func(err error) (*Store, error) {
		cancel()
		<-s.done
		s.index.close()
		return nil, err
	}
	// MongoDBURI blocks until Run has bound the listener.
	uric := make(chan string, 1)
	go func() { uric <- f.MongoDBURI() }()
	var upstream string
	select {
	case u := <-uric:
		upstream = trimURI(u)
	case <-time.After(30 * time.Second):
		return fail(errors.New("embedded store: listener did not start within 30s"))
	}
	if err := waitDial(upstream, 10*time.Second); err != nil {
		return fail(err)
	}
	ictx, icancel := context.WithTimeout(ctx, 5*time.Minute)
	err = s.index.ensureAll(ictx)
	icancel()
	if err != nil {
		return fail(fmt.Errorf("embedded store: %w", err))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fail(fmt.Errorf("embedded store: %w", err))
	}
	s.funnel = newFunnel(ln, upstream, s.index, log)
	s.funnel.streams = newStreams(abs, o.testCommands)
	go s.funnel.serve()
	s.URI = "mongodb://" + ln.Addr().String() + "/"
	return s, nil
}

// Close stops the funnel and the store and waits for the store's files to
// be closed. Requests in flight are dropped, as by a server that dies: their
// clients see a network error.
func (s *Store) Close() error {
	s.funnel.close()
	s.cancel()
	<-s.done
	s.index.close()
	return nil
}

func trimURI(u string) string {
	const p = "mongodb://"
	if len(u) > len(p) && u[:len(p)] == p {
		u = u[len(p):]
	}
	if i := len(u) - 1; i >= 0 && u[i] == '/' {
		u = u[:i]
	}
	return u
}

func waitDial(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("embedded store at %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartNATS starts a NATS server with JetStream storing under dir,
// listening on host:port (port -1 picks a free one). It returns once the
// server is ready for connections; ClientURL gives its address.
func StartNATS(dir, host string, port int) (*server.Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded nats dir: %w", err)
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "orderd-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded nats: not ready within 30s")
	}
	return ns, nil
}
