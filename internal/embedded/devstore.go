// Package embedded runs the development servers in-process: FerretDB 1.24
// on SQLite (a MongoDB wire-protocol store) and a NATS server with
// JetStream. `orderd` uses it when no MONGODB_URI and no NATS_URL are set,
// and the tests use it when no external servers are named. Production
// binaries leave it out: cmd/orderd imports it only without the `noembed`
// build tag.
//
// The store keeps MongoDB's single-document guarantees through its write
// funnel (funnel.go), indexes every collection's _id (index.go), and
// serves what the service asks that FerretDB cannot serve at index speed
// or at all, and nothing else: guarded updates (guard.go), the log's
// change stream (changestream.go), the log browser's pages (logpage.go)
// and the finds in _id order (indexfind.go); docs/embedded-store.md lists
// the differences that remain. A commit is durable against a crash of the
// process, not of the machine (SQLite's synchronous=NORMAL).
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
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
func (s *Store) WriteCosts() map[WriteKind]WriteCost { return s.funnel.slot.costs() }

// StartStore starts FerretDB on SQLite with its files in dir, on a
// loopback port nobody else is told, and the funnel (funnel.go) in front
// of it listening on addr ("127.0.0.1:0" for any free port), through which
// every client reaches it. It returns once the funnel accepts connections.
// Options: WithTestCommands.
func StartStore(dir, addr string, log *slog.Logger, opts ...StoreOption) (*Store, error) {
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
	// temp_store(memory): the statement journal of a multi-document
	// insert, in a file by default, cost a fifth of the store's CPU under
	// group-committed appends, and holds nothing a crash must keep
	// (docs/embedded-store.md, "Why SQLite's temporary store is in memory").
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
		s.index.forget("", "")
		return nil, err
	}
	// New has bound FerretDB's listener already: MongoDBURI does not block,
	// and a client dialling before Run accepts waits in the backlog.
	upstream := strings.TrimSuffix(strings.TrimPrefix(f.MongoDBURI(), "mongodb://"), "/")
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
	for _, opt := range opts {
		opt(s.funnel)
	}
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
	s.index.forget("", "")
	return nil
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
