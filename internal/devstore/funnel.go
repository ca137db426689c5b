package devstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// funnel is the embedded store's listener: a MongoDB wire-protocol proxy in
// front of FerretDB that sends every write command through one upstream
// connection, one command at a time, and every other command through an
// upstream connection of the client's own.
//
// Why: FerretDB 1.24 runs a conditional update as a read and a later write
// with no transaction, so two clients racing updateOne({_id, state: old})
// both won in ~990 of 1000 rounds (DESIGN.md §8); but a FerretDB connection
// runs its commands one after another, and through a single connection 0 of
// 1000 rounds had two winners. Funnelling the writes gives every client, in
// any process, MongoDB's single-document atomicity. SQLite has one writer
// anyway, so the funnel costs little write throughput; reads, which FerretDB
// filters in Go and which can be long scans, keep their own connections and
// never stall the writes.
//
// After a write command the funnel also gives the collection it named the
// _id expression index (index.go), before the next write runs. It takes
// the one partial filter FerretDB can keep out of createIndexes
// (withoutExistsFilters).
type funnel struct {
	ln       net.Listener
	upstream string // FerretDB's own listener
	index    *idIndex
	log      *slog.Logger

	writeMu sync.Mutex
	writer  net.Conn // nil until the first write, and after an error

	mu      sync.Mutex
	clients map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Wire protocol constants (MongoDB's OP_MSG specification).
const (
	opMsg           = 2013
	headerLen       = 16
	flagChecksum    = 1 << 0
	flagMoreToCome  = 1 << 1
	maxMessageBytes = 64 << 20 // above MongoDB's 48 MB maxMessageSizeBytes
)

// writeCommands are the commands that change data or metadata; each runs
// alone on the funnel's one connection. Names are lower-cased.
var writeCommands = map[string]bool{
	"insert": true, "update": true, "delete": true, "findandmodify": true,
	"create": true, "drop": true, "dropdatabase": true, "createindexes": true,
	"dropindexes": true, "renamecollection": true, "collmod": true,
}

func newFunnel(ln net.Listener, upstream string, index *idIndex, log *slog.Logger) *funnel {
	return &funnel{ln: ln, upstream: upstream, index: index, log: log, clients: map[net.Conn]struct{}{}}
}

// serve accepts clients until the listener is closed.
func (f *funnel) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.clients[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.client(c)
			f.mu.Lock()
			delete(f.clients, c)
			f.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// close stops accepting, drops every client and the writer, and waits for
// the client goroutines.
func (f *funnel) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.clients {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.writeMu.Lock()
	if f.writer != nil {
		_ = f.writer.Close()
		f.writer = nil
	}
	f.writeMu.Unlock()
}

// client relays one client connection. Drivers send one request at a time
// per connection and wait for its reply, so a plain loop keeps the order.
// Any error closes the client connection, which a driver sees as a network
// error (and retries where the operation is retryable).
func (f *funnel) client(c net.Conn) {
	var own net.Conn
	defer func() {
		if own != nil {
			_ = own.Close()
		}
	}()
	for {
		req, err := readMessage(c)
		if err != nil {
			return
		}
		if cmd, ok := parseCommand(req); ok && writeCommands[strings.ToLower(cmd.name)] {
			if err := f.write(c, req, cmd); err != nil {
				if !errors.Is(err, net.ErrClosed) {
					f.log.Warn("embedded store write funnel", "command", cmd.name, "err", err)
				}
				return
			}
			continue
		}
		if own == nil {
			if own, err = net.Dial("tcp", f.upstream); err != nil {
				return
			}
		}
		if err := relay(own, c, req); err != nil {
			return
		}
	}
}

// write runs one write command on the funnel's connection, answers the
// client, and indexes the collection the command created, all before the
// next write starts.
func (f *funnel) write(c net.Conn, req []byte, cmd command) error {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	if f.writer == nil {
		w, err := net.Dial("tcp", f.upstream)
		if err != nil {
			return fmt.Errorf("dial store: %w", err)
		}
		f.writer = w
	}
	name := strings.ToLower(cmd.name)
	if name == "createindexes" {
		req = withoutExistsFilters(req)
	}
	if name == "dropdatabase" {
		// FerretDB removes the database's file; the index keeper must not
		// hold it open or later index a removed file.
		f.index.forgetDatabase(cmd.db)
	}
	if err := relay(f.writer, c, req); err != nil {
		_ = f.writer.Close()
		f.writer = nil
		return err
	}
	switch name {
	case "drop", "renamecollection":
		f.index.forget(cmd.db, cmd.collection)
	case "dropdatabase":
		f.index.forgetDatabase(cmd.db)
	default:
		if err := f.index.ensure(context.Background(), cmd.db, cmd.collection); err != nil {
			f.log.Warn("embedded store _id index", "db", cmd.db, "collection", cmd.collection, "err", err)
		}
	}
	return nil
}

// relay sends req on up and copies the replies back to c: none when the
// request says moreToCome, several while a reply says moreToCome
// (exhaust cursors and streaming hello).
func relay(up, c net.Conn, req []byte) error {
	if _, err := up.Write(req); err != nil {
		return err
	}
	if opCode(req) == opMsg && msgFlags(req)&flagMoreToCome != 0 {
		return nil
	}
	for {
		resp, err := readMessage(up)
		if err != nil {
			return err
		}
		if _, err := c.Write(resp); err != nil {
			return err
		}
		if opCode(resp) != opMsg || msgFlags(resp)&flagMoreToCome == 0 {
			return nil
		}
	}
}

// readMessage reads one whole wire-protocol message.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.LittleEndian.Uint32(hdr[:])))
	if n < headerLen || n > maxMessageBytes {
		return nil, fmt.Errorf("wire message of %d bytes", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

func opCode(msg []byte) int32 { return int32(binary.LittleEndian.Uint32(msg[12:16])) }

func msgFlags(msg []byte) uint32 {
	if len(msg) < headerLen+4 {
		return 0
	}
	return binary.LittleEndian.Uint32(msg[16:20])
}

// command is what the funnel needs of a request: the command's name (the
// body's first key), its database and the collection it names.
type command struct {
	name, db, collection string
}

// parseCommand reads an OP_MSG's body section (kind 0). Other op codes
// (the legacy OP_QUERY of a first handshake) are not commands to funnel.
func parseCommand(msg []byte) (command, bool) {
	if opCode(msg) != opMsg || len(msg) < headerLen+5 {
		return command{}, false
	}
	end := len(msg)
	if msgFlags(msg)&flagChecksum != 0 {
		end -= 4
	}
	for p := headerLen + 4; p < end; {
		kind := msg[p]
		p++
		if p+4 > end {
			return command{}, false
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[p:])))
		if size < 5 || p+size > end {
			return command{}, false
		}
		if kind != 0 {
			p += size // a document sequence: its size counts itself
			continue
		}
		body := bson.Raw(msg[p : p+size])
		elems, err := body.Elements()
		if err != nil || len(elems) == 0 {
			return command{}, false
		}
		cmd := command{name: elems[0].Key()}
		cmd.collection, _ = elems[0].Value().StringValueOK()
		cmd.db, _ = body.Lookup("$db").StringValueOK()
		if strings.EqualFold(cmd.name, "renameCollection") {
			// {renameCollection: "db.from", to: "db.to"}, sent to admin.
			cmd.db, cmd.collection, _ = strings.Cut(cmd.collection, ".")
		}
		return cmd, true
	}
	return command{}, false
}

// withoutExistsFilters returns a createIndexes request without the
// partialFilterExpression of each unique index whose filter is exactly
// {f: {$exists: true}} for a field f of the index's key; any other request
// comes back unchanged. FerretDB 1.24 refuses partial indexes, and such an
// index means the same as FerretDB's plain unique index there: SQLite
// indexes a missing field as NULL, and NULLs never collide in a unique
// index, so documents without f are never compared, as on MongoDB. Other
// partial filters are left for FerretDB to refuse.
func withoutExistsFilters(req []byte) []byte {
	if opCode(req) != opMsg || len(req) < headerLen+5 {
		return req
	}
	end := len(req)
	if msgFlags(req)&flagChecksum != 0 {
		end -= 4
	}
	for p := headerLen + 4; p < end; {
		kind := req[p]
		if p+5 > end {
			return req
		}
		size := int(int32(binary.LittleEndian.Uint32(req[p+1:])))
		if size < 5 || p+1+size > end {
			return req
		}
		if kind != 0 {
			p += 1 + size
			continue
		}
		body, changed := stripExistsFilters(bson.Raw(req[p+1 : p+1+size]))
		if !changed {
			return req
		}
		// The same message with the new body, without a checksum (it would
		// no longer match; clients rarely send one).
		out := make([]byte, 0, len(req)-size+len(body))
		out = append(out, req[:headerLen]...)
		out = binary.LittleEndian.AppendUint32(out, msgFlags(req)&^flagChecksum)
		out = append(out, req[headerLen+4:p+1]...)
		out = append(out, body...)
		out = append(out, req[p+1+size:end]...)
		binary.LittleEndian.PutUint32(out, uint32(len(out)))
		return out
	}
	return req
}

// stripExistsFilters is withoutExistsFilters on the command's body.
func stripExistsFilters(body bson.Raw) (bson.Raw, bool) {
	var cmd bson.D
	if err := bson.Unmarshal(body, &cmd); err != nil {
		return body, false
	}
	changed := false
	for i := range cmd {
		if cmd[i].Key != "indexes" {
			continue
		}
		indexes, ok := cmd[i].Value.(bson.A)
		if !ok {
			return body, false
		}
		for j, ix := range indexes {
			spec, ok := ix.(bson.D)
			if !ok {
				continue
			}
			if out, ok := withoutExistsFilter(spec); ok {
				indexes[j], changed = out, true
			}
		}
	}
	if !changed {
		return body, false
	}
	out, err := bson.Marshal(cmd)
	if err != nil {
		return body, false
	}
	return out, true
}

// withoutExistsFilter returns spec without its partialFilterExpression when
// spec is unique and the filter is {f: {$exists: true}} for a field f of
// its key.
func withoutExistsFilter(spec bson.D) (bson.D, bool) {
	var key, filter bson.D
	unique := false
	for _, e := range spec {
		switch e.Key {
		case "key":
			key, _ = e.Value.(bson.D)
		case "partialFilterExpression":
			filter, _ = e.Value.(bson.D)
		case "unique":
			unique, _ = e.Value.(bool)
		}
	}
	if !unique || len(filter) != 1 {
		return nil, false
	}
	cond, _ := filter[0].Value.(bson.D)
	if len(cond) != 1 || cond[0].Key != "$exists" || cond[0].Value != true {
		return nil, false
	}
	if !slices.ContainsFunc(key, func(e bson.E) bool { return e.Key == filter[0].Key }) {
		return nil, false
	}
	return slices.DeleteFunc(slices.Clone(spec), func(e bson.E) bool { return e.Key == "partialFilterExpression" }), true
}
