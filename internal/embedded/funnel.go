package embedded

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/FerretDB/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// funnel is the embedded store's listener: a MongoDB wire-protocol proxy in
// front of FerretDB that sends every write command through one upstream
// connection, one command at a time, and every other command through an
// upstream connection of the client's own. FerretDB 1.24 runs a
// conditional update as a read and a later write with no transaction: two
// clients racing updateOne({_id, state: old}) both won in most rounds,
// through one connection never (docs/embedded-store.md, "Atomic
// conditional updates").
type funnel struct {
	ln       net.Listener
	upstream string // FerretDB's own listener
	index    *idIndex
	log      *slog.Logger
	streams  *streams // changestream.go

	slot   writeSlot
	writer net.Conn // held with slot; nil until the first write, and after an error

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // clients, their upstream connections and the writer
	wg     sync.WaitGroup
}

// writeCommands are the commands that change data or metadata; each runs
// alone on the funnel's one connection. Names are lower-cased.
var writeCommands = map[string]bool{
	"insert": true, "update": true, "delete": true, "findandmodify": true,
	"create": true, "drop": true, "dropdatabase": true, "createindexes": true,
	"dropindexes": true,
}

func newFunnel(ln net.Listener, upstream string, index *idIndex, log *slog.Logger) *funnel {
	return &funnel{ln: ln, upstream: upstream, index: index, log: log, conns: map[net.Conn]struct{}{},
		streams: newStreams()}
}

// serve accepts clients until the listener is closed.
func (f *funnel) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c, true) { // accepted as close ran: never served
			_ = c.Close()
			return
		}
		go func() {
			defer f.wg.Done()
			f.client(c)
			f.untrack(c)
		}()
	}
}

// track records a connection for close to drop, and for a client (serve
// true) its goroutine for close to wait for; false once close has run.
func (f *funnel) track(c net.Conn, serve bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	if serve {
		f.wg.Add(1) // under mu, so close's Wait counts it
	}
	return true
}

// untrack closes c and forgets it.
func (f *funnel) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

// close stops accepting and drops every connection, upstream ones too, so
// a request in flight fails at once, as when a server dies (its outcome is
// unknown to the client, as it would be then). It then waits for the
// client goroutines.
func (f *funnel) close() {
	_ = f.ln.Close()
	f.streams.close() // getMores waiting for inserts return
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.writer = nil // closed above; no client goroutine is left to use it
}

// client relays one client connection. Drivers send one request at a time
// per connection and wait for its reply, so a plain loop keeps the order.
// Any error closes the client connection, which a driver sees as a network
// error (and retries where the operation is retryable).
func (f *funnel) client(c net.Conn) {
	var own net.Conn
	defer func() {
		f.streams.dropOwnedBy(c)
		if own != nil {
			f.untrack(own)
		}
	}()
	upstream := func() (net.Conn, error) {
		if own != nil {
			return own, nil
		}
		up, err := net.Dial("tcp", f.upstream)
		if err != nil {
			return nil, err
		}
		if !f.track(up, false) {
			_ = up.Close()
			return nil, net.ErrClosed
		}
		own = up
		return own, nil
	}
	for {
		req, err := readMessage(c)
		if err != nil {
			return
		}
		cmd, ok := parseCommand(req)
		served := false
		if ok && writeCommands[strings.ToLower(cmd.name)] {
			if err = f.write(c, req, cmd); err != nil && !errors.Is(err, net.ErrClosed) {
				f.log.Warn("embedded store write funnel", "command", cmd.name, "err", err)
			}
			served = true
		} else if ok {
			served, err = f.serveStream(c, req, cmd, upstream)
		}
		if err == nil && !served {
			if _, err = upstream(); err == nil && ok {
				served, err = f.serveFind(own, c, req, cmd)
			}
			if err == nil && !served {
				_, err = relay(own, c, req)
			}
		}
		if err != nil {
			return
		}
	}
}

// write runs one write command on the funnel's connection, answers the
// client, and indexes the collection the command created, all before the
// next write starts.
func (f *funnel) write(c net.Conn, req []byte, cmd command) error {
	name := strings.ToLower(cmd.name)
	asked := time.Now()
	f.slot.acquire()
	defer f.slot.release(name, cmd.collection, asked)
	if f.writer == nil {
		w, err := net.Dial("tcp", f.upstream)
		if err != nil {
			return fmt.Errorf("dial store: %w", err)
		}
		if !f.track(w, false) {
			_ = w.Close()
			return net.ErrClosed
		}
		f.writer = w
	}
	if name == "createindexes" {
		req = withoutPartialFilters(req, cmd.msg)
	}
	if name == "dropdatabase" {
		// FerretDB removes the database's file; the index keeper must not
		// hold it open or later index a removed file.
		f.index.forget(cmd.db, "")
		f.streams.cache.dropCollection(cmd.db, "")
	}
	if err := f.send(c, req, cmd); err != nil {
		f.untrack(f.writer)
		f.writer = nil
		// Whether it added rows is not known: the next insert reads the
		// table's end instead of counting from it.
		f.streams.cache.setEnd(cmd.db, cmd.collection, 0, false)
		return err
	}
	switch name {
	case "drop":
		f.index.forget(cmd.db, cmd.collection)
		f.streams.cache.dropCollection(cmd.db, cmd.collection)
		return nil
	case "dropdatabase":
		f.index.forget(cmd.db, "")
		return nil
	case "delete", "findandmodify":
		// A delete may free the table's last rowids for the next insert:
		// the cached documents may no longer be at theirs.
		if cmd.collection == LogCollection {
			f.streams.cache.dropCollection(cmd.db, cmd.collection)
		}
	case "update": // an upsert adds a row
		f.streams.cache.setEnd(cmd.db, cmd.collection, 0, false)
	}
	if err := f.index.ensure(context.Background(), cmd.db, cmd.collection); err != nil {
		f.log.Warn("embedded store _id index", "db", cmd.db, "collection", cmd.collection, "err", err)
	}
	return nil
}

// send runs req on the funnel's connection and answers c: an update with
// guards on top of _id is served statement by statement (guard.go), any
// other write is relayed as it is. What an insert stored is recorded for
// change streams (insertCommitted) before the next write runs: their order
// is the order of the funnel's writes.
func (f *funnel) send(c net.Conn, req []byte, cmd command) error {
	var stmts []guardedUpdate
	ordered, guarded := false, false
	if strings.EqualFold(cmd.name, "update") {
		stmts, ordered, guarded = guardedUpdates(cmd.msg)
	}
	if !guarded {
		resp, err := relay(f.writer, c, req)
		if resp != nil && strings.EqualFold(cmd.name, "insert") {
			f.insertCommitted(cmd, parseOpMsg(resp).body())
		}
		return err
	}
	h, err := f.index.handle(cmd.db)
	if err != nil {
		return err
	}
	reply, err := serveGuarded(f.writer, h, cmd.db, cmd.collection, stmts, ordered)
	if err != nil {
		return err
	}
	return answer(c, req, cmd, reply)
}

// relay sends req on up and copies its reply back to c, none when the
// request says moreToCome. FerretDB 1.24 answers every request with one
// message, a request that says moreToCome too, and sets no moreToCome on
// a reply (it serves no exhaust cursor or streaming hello): the answer to
// a quiet request is read and dropped, or the next request on up would be
// given it (TestUnacknowledgedWritesKeepAnswersInStep). It returns the
// reply read from up, nil when none was.
func relay(up, c net.Conn, req []byte) ([]byte, error) {
	if _, err := up.Write(req); err != nil {
		return nil, err
	}
	resp, err := readMessage(up)
	if err != nil || opCode(req) == wire.OpCodeMsg && msgFlags(req)&flagMoreToCome != 0 {
		return resp, err
	}
	_, err = c.Write(resp)
	return resp, err
}

// withoutPartialFilters returns a createIndexes request (req, parsed as m)
// without the partialFilterExpression of each unique index whose filter is
// exactly {f: {$exists: true}} for a field f of its key (the log's
// idempotency key index); any other request comes back unchanged.
// FerretDB 1.24 refuses partial indexes, and its plain unique index means
// the same: SQLite indexes a missing field as NULL, and NULLs never
// collide in a unique index. A request with a document sequence (the
// driver sends createIndexes as its body alone) comes back unchanged.
func withoutPartialFilters(req []byte, m *opMsg) []byte {
	var cmd bson.D
	if m == nil || len(m.seqs) != 0 || bson.Unmarshal(m.body(), &cmd) != nil {
		return req
	}
	exists, _ := bson.Marshal(bson.D{{Key: "$exists", Value: true}})
	changed := false
	indexes, _ := field(cmd, "indexes").(bson.A)
	for j := range indexes {
		raw, _ := bson.Marshal(indexes[j])
		spec := bson.Raw(raw)
		partial, _ := spec.Lookup("partialFilterExpression").DocumentOK()
		filter, _ := partial.Elements()
		unique, _ := spec.Lookup("unique").BooleanOK()
		if !unique || len(filter) != 1 || !bytes.Equal(filter[0].Value().Value, exists) {
			continue
		}
		if _, err := spec.LookupErr("key", filter[0].Key()); err == nil {
			d, _ := indexes[j].(bson.D)
			indexes[j] = slices.DeleteFunc(d, func(e bson.E) bool { return e.Key == "partialFilterExpression" })
			changed = true
		}
	}
	body, err := bson.Marshal(cmd)
	if !changed || err != nil {
		return req
	}
	// The request's id, which FerretDB's answer names, and its flags but
	// the checksum, which would no longer match.
	out := opMessage(body, 0)
	copy(out[4:8], req[4:8])
	binary.LittleEndian.PutUint32(out[16:], m.flags&^flagChecksum)
	return out
}
