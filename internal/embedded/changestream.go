package embedded

import (
	"bytes"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Change streams, which FerretDB 1.24 lacks: the funnel serves the one
// stream the relay and the log browser's tail open, [{$changeStream: {}
// or {resumeAfter: t}}, {$match: {operationType: "insert"}}], and refuses
// any other with NotImplemented (docs/embedded-store.md, "Change
// streams"). Positions are rowids of the collection's table with its uuid:
// one writer, so in an insert-only collection rowid order is commit order.

// Error codes from MongoDB's error_codes.yml.
const (
	codeCursorInUse               = 292
	codeCommandNotSupported       = 115
	codeInvalidResumeToken        = 260
	codeChangeStreamHistLost      = 286
	codeBadValue                  = 2
	codeNotImplemented            = 238
	defaultGetMoreBatch           = 1000
	defaultAwait                  = time.Second
	maxBatchBytes                 = 8 << 20 // well under MongoDB's 16 MiB reply
	tokenVersion             byte = 1
	tokenLen                      = 1 + 16 + 8
	noUUID                        = "00000000000000000000000000000000" // of a collection that does not exist
)

// ForgetChangesCommand is the test command {forgetChangesBefore:
// "<collection>", $db: "<db>"}: a stream resuming from a position before
// the collection's end now answers ChangeStreamHistoryLost (286), as when
// MongoDB's oplog has rolled past a token; one at the end resumes. Served
// only WithTestCommands; a restart forgets it.
const ForgetChangesCommand = "forgetChangesBefore"

// StoreOption configures the funnel StartStore starts.
type StoreOption func(*funnel)

// WithTestCommands makes the store serve its test commands
// (ForgetChangesCommand); without it they are unknown commands.
func WithTestCommands() StoreOption { return func(f *funnel) { f.streams.testCommands = true } }

// streams is the funnel's change-stream state.
type streams struct {
	testCommands bool
	stop         chan struct{} // closed by the funnel's close: waiters return
	cache        docCache

	mu        sync.Mutex
	lastID    int64 // cursor ids go on from the start's time: no id of an earlier run names a new stream
	cursors   map[int64]*streamCursor
	wake      chan struct{}    // closed and replaced at each committed insert
	forgotten map[string]int64 // uuid → the last forgotten rowid
}

// streamCursor is an open change stream.
type streamCursor struct {
	id       int64
	db, coll string
	uuid     string     // hex; noUUID while the collection did not exist
	pos      int64      // the rowid of the last event reported, or where it opened
	owner    net.Conn   // the client connection that used it last
	inUse    sync.Mutex // held by its getMore: one at a time, as on MongoDB
}

func newStreams() *streams {
	return &streams{stop: make(chan struct{}), lastID: time.Now().UnixNano(),
		cursors: map[int64]*streamCursor{}, wake: make(chan struct{}),
		forgotten: map[string]int64{}}
}

// close wakes every waiter.
func (s *streams) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
}

// committed wakes the waiting streams, of every collection: an insert
// committed. Each reads its own collection again.
func (s *streams) committed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.wake)
	s.wake = make(chan struct{})
}

// waitChan is closed at the next committed insert.
func (s *streams) waitChan() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wake
}

// dropOwnedBy drops the cursors whose client connection closed.
func (s *streams) dropOwnedBy(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, cur := range s.cursors {
		if cur.owner == c {
			delete(s.cursors, id)
		}
	}
}

// position is what one read of a collection's table found.
type position struct {
	uuid  string  // hex; noUUID when the collection does not exist
	table string  // the collection's SQLite table
	end   int64   // the largest rowid, 0 for an empty table (a read of no rows)
	rows  []int64 // the rowids after the position asked, in order
}

// read reads db.coll's identity and, with a limit, up to limit rowids
// after rowid after, in one snapshot (a transaction of reads), or without
// one (limit 0) its end.
func (f *funnel) read(db, coll string, after int64, limit int) (position, error) {
	p := position{uuid: noUUID}
	h, err := f.index.handle(db)
	if err != nil || h == nil {
		return p, err
	}
	tx, err := h.Begin()
	if err != nil {
		return p, err
	}
	defer func() { _ = tx.Rollback() }()
	table, settings, err := tableOf(tx, coll)
	if err != nil || table == "" {
		return p, err
	}
	var meta struct{ UUID string }
	_ = json.Unmarshal([]byte(settings), &meta)
	u := strings.ToLower(strings.ReplaceAll(meta.UUID, "-", ""))
	if b, err := hex.DecodeString(u); err != nil || len(b) != 16 {
		return p, fmt.Errorf("collection %s.%s: uuid %q", db, coll, meta.UUID)
	}
	p.uuid, p.table = u, table
	if limit <= 0 {
		var end sql.NullInt64
		err := tx.QueryRow(fmt.Sprintf(`SELECT max(rowid) FROM %q`, table)).Scan(&end)
		p.end = end.Int64
		return p, err
	}
	rows, err := tx.Query(fmt.Sprintf(`SELECT rowid FROM %q WHERE rowid > ? ORDER BY rowid LIMIT ?`, table), after, limit)
	if err != nil {
		return p, err
	}
	defer rows.Close()
	for rows.Next() {
		var r int64
		if err := rows.Scan(&r); err != nil {
			return p, err
		}
		p.rows = append(p.rows, r)
	}
	return p, rows.Err()
}

// idAt reads the _id of the row at rowid of table in database db, for a
// document the cache does not hold: "" when it is not a string or there
// is no such row.
func (f *funnel) idAt(db, table string, rowid int64) (string, error) {
	h, err := f.index.handle(db)
	if err != nil || h == nil {
		return "", err
	}
	var id string
	err = h.QueryRow(fmt.Sprintf(`SELECT iif(%s = 'string', %s, '') FROM %q WHERE rowid = ?`, idType, idExpr, table), rowid).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// token is a resume token: {_data: hex(version, uuid, rowid)}.
func token(uuid string, rowid int64) bson.D {
	return bson.D{{Key: "_data", Value: fmt.Sprintf("%02x%s%016x", tokenVersion, uuid, rowid)}}
}

// parseToken reads a token the funnel issued.
func parseToken(v bson.RawValue) (uuid string, rowid int64, ok bool) {
	d, _ := v.DocumentOK()
	s, _ := d.Lookup("_data").StringValueOK()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != tokenLen || b[0] != tokenVersion {
		return "", 0, false
	}
	rowid = int64(binary.BigEndian.Uint64(b[17:]))
	return s[2:34], rowid, rowid >= 0
}

// insertsStage is the one stage a stream has after $changeStream.
var insertsStage, _ = bson.Marshal(bson.D{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}})

// openStream serves an aggregate whose pipeline starts with $changeStream.
func (f *funnel) openStream(c net.Conn, req []byte, cmd command) error {
	s := f.streams
	body := cmd.msg.body()
	refuse := func(code int32, name, msg string) error { return answer(c, req, cmd, refusal(code, name, msg)) }
	if _, isString := body.Lookup("aggregate").StringValueOK(); !isString {
		return refuse(codeNotImplemented, "NotImplemented",
			"$changeStream: the embedded store serves change streams of one collection only")
	}
	arr, _ := body.Lookup("pipeline").ArrayOK()
	stages, _ := arr.Values()
	if len(stages) != 2 || !bytes.Equal(stages[1].Value, insertsStage) {
		return refuse(codeNotImplemented, "NotImplemented",
			`$changeStream: the embedded store reports inserts only; add {$match: {operationType: "insert"}} as the stream's only other stage`)
	}
	stage, _ := stages[0].Document().Lookup("$changeStream").DocumentOK()
	elems, err := stage.Elements()
	if err != nil {
		return refuse(codeBadValue, "BadValue", "$changeStream: options must be a document")
	}
	for _, e := range elems {
		if e.Key() != "resumeAfter" {
			return refuse(codeNotImplemented, "NotImplemented", "$changeStream: the embedded store does not serve option "+e.Key())
		}
	}
	p, err := f.read(cmd.db, cmd.collection, 0, 0)
	if err != nil {
		return refuse(1, "InternalError", "$changeStream: "+err.Error())
	}
	cur := &streamCursor{db: cmd.db, coll: cmd.collection, uuid: p.uuid, pos: p.end, owner: c}
	if resume := stage.Lookup("resumeAfter"); resume.Type != 0 {
		u, rowid, ok := parseToken(resume)
		if !ok || u == noUUID && rowid != 0 {
			return refuse(codeInvalidResumeToken, "InvalidResumeToken", "$changeStream: not a resume token of the embedded store")
		}
		if u != noUUID && u != p.uuid {
			return refuse(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("$changeStream: the resume token is of another incarnation of %s.%s (dropped or re-created since)", cmd.db, cmd.collection))
		}
		cur.pos = rowid
		s.mu.Lock()
		w, forgot := s.forgotten[p.uuid]
		s.mu.Unlock()
		// A position before the mark needs events the store forgot; one at
		// it needs none of them, as a stream opened after the forgetting.
		if forgot && cur.pos < w {
			return refuse(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("$changeStream: the history of %s.%s up to the resume point was forgotten (%s)", cmd.db, cmd.collection, ForgetChangesCommand))
		}
	}
	s.mu.Lock()
	s.lastID++
	cur.id = s.lastID
	s.cursors[cur.id] = cur
	s.mu.Unlock()
	// An empty first batch and no operationTime: the driver keeps this
	// batch's postBatchResumeToken and resumes from it (mongo/change_stream.go).
	return answer(c, req, cmd, cursorReply(cur, "firstBatch", bson.A{}))
}

// cursorReply is MongoDB's answer with one batch of a stream's events.
func cursorReply(cur *streamCursor, batch string, events bson.A) bson.D {
	return bson.D{{Key: "cursor", Value: bson.D{
		{Key: batch, Value: events},
		{Key: "postBatchResumeToken", Value: token(cur.uuid, cur.pos)},
		{Key: "id", Value: cur.id},
		{Key: "ns", Value: cur.db + "." + cur.coll},
	}}, {Key: "ok", Value: 1.0}}
}

// batch is the answer to a getMore of the stream cur on c; up is the
// client's own upstream connection, for reading documents back; an error
// means up failed. A getMore while another holds the cursor is answered
// CursorInUse.
func (f *funnel) batch(up, c net.Conn, cmd command, cur *streamCursor) (bson.D, error) {
	s := f.streams
	body := cmd.msg.body()
	if coll, _ := body.Lookup("collection").StringValueOK(); coll != cur.coll || cmd.db != cur.db {
		return refusal(13, "Unauthorized", fmt.Sprintf("cursor %d is of %s.%s", cur.id, cur.db, cur.coll)), nil
	}
	if !cur.inUse.TryLock() {
		return refusal(codeCursorInUse, "CursorInUse", fmt.Sprintf("cursor %d is in use by another getMore", cur.id)), nil
	}
	defer cur.inUse.Unlock()
	s.mu.Lock()
	cur.owner = c
	s.mu.Unlock()
	limit := defaultGetMoreBatch
	if n, ok := body.Lookup("batchSize").AsInt64OK(); ok && n > 0 {
		limit = int(min(n, defaultGetMoreBatch*10))
	}
	wait := defaultAwait
	if ms, ok := body.Lookup("maxTimeMS").AsInt64OK(); ok && ms > 0 {
		wait = time.Duration(ms) * time.Millisecond
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		woken := s.waitChan() // before the read: no commit is missed
		p, err := f.read(cur.db, cur.coll, cur.pos, limit)
		if err != nil {
			return refusal(1, "InternalError", "getMore: "+err.Error()), nil
		}
		if cur.uuid == noUUID {
			cur.uuid = p.uuid // created since the stream opened, if at all
		}
		if p.uuid != cur.uuid {
			s.mu.Lock()
			delete(s.cursors, cur.id)
			s.mu.Unlock()
			return refusal(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("getMore: %s.%s was dropped or re-created since the stream opened", cur.db, cur.coll)), nil
		}
		if len(p.rows) > 0 {
			events, err := f.events(up, cur, p)
			if err != nil {
				return nil, err
			}
			if events == nil {
				return refusal(1, "InternalError", "getMore: a document of the stream could not be read back from the store"), nil
			}
			return cursorReply(cur, "nextBatch", events), nil
		}
		select {
		case <-woken:
			continue
		case <-deadline.C:
		case <-s.stop:
		}
		return cursorReply(cur, "nextBatch", bson.A{}), nil
	}
}

// events builds the insert events of p's rows, advancing cur past those
// it reports (up to maxBatchBytes, and up to a document it cannot read
// back). A nil slice with no error means the first row's document could
// not be read back; an error means up or the store's file failed.
func (f *funnel) events(up net.Conn, cur *streamCursor, p position) (bson.A, error) {
	out := bson.A{}
	size := 0
	ns := bson.D{{Key: "db", Value: cur.db}, {Key: "coll", Value: cur.coll}}
	for _, rowid := range p.rows {
		raw, ok := f.streams.cache.get(cur.db, cur.coll, rowid)
		doc := bson.Raw(raw)
		if !ok {
			id, err := f.idAt(cur.db, p.table, rowid)
			if err == nil {
				doc, err = readBack(up, cur.db, cur.coll, id)
			}
			if err != nil {
				return nil, err
			}
			if doc == nil {
				if len(out) > 0 {
					break // the events before it; the next getMore fails on it
				}
				f.log.Warn("embedded store change stream: document not read back", "db", cur.db, "collection", cur.coll, "rowid", rowid)
				return nil, nil
			}
		}
		if size > 0 && size+len(doc) > maxBatchBytes {
			break
		}
		size += len(doc)
		out = append(out, bson.D{
			{Key: "_id", Value: token(cur.uuid, rowid)},
			{Key: "operationType", Value: "insert"},
			{Key: "ns", Value: ns},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: doc.Lookup("_id")}}},
			{Key: "fullDocument", Value: doc},
		})
		cur.pos = rowid
	}
	return out, nil
}

// readBack reads one document from FerretDB by its string _id on up; nil
// when there is none (or id is "").
func readBack(up net.Conn, db, coll, id string) (bson.Raw, error) {
	if id == "" {
		return nil, nil
	}
	reply, err := roundTrip(up, bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "limit", Value: int64(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: db}})
	if err != nil {
		return nil, err
	}
	doc, _ := reply.Lookup("cursor", "firstBatch", "0").DocumentOK()
	return bytes.Clone(doc), nil
}

// killStreams serves a killCursors naming one of the funnel's cursors, as
// the driver sends it (a cursor at a time); handled is false when it names
// none of them (FerretDB answers it). One naming a funnel's cursor among
// others is refused (NotImplemented).
func (f *funnel) killStreams(c net.Conn, req []byte, cmd command) (handled bool, err error) {
	s := f.streams
	arr, _ := cmd.msg.body().Lookup("cursors").ArrayOK()
	vals, _ := arr.Values()
	s.mu.Lock()
	ours := slices.ContainsFunc(vals, func(v bson.RawValue) bool {
		id, _ := v.AsInt64OK()
		cur := s.cursors[id]
		return cur != nil && cur.db == cmd.db && cur.coll == cmd.collection
	})
	if ours && len(vals) == 1 {
		delete(s.cursors, vals[0].AsInt64())
	}
	s.mu.Unlock()
	switch {
	case !ours:
		return false, nil
	case len(vals) > 1:
		return true, answer(c, req, cmd, refusal(codeNotImplemented, "NotImplemented",
			"killCursors: the embedded store kills its change streams' cursors one at a time, apart from other cursors"))
	}
	return true, answer(c, req, cmd, bson.D{{Key: "cursorsKilled", Value: bson.A{vals[0].AsInt64()}}, {Key: "cursorsNotFound", Value: bson.A{}},
		{Key: "cursorsAlive", Value: bson.A{}}, {Key: "cursorsUnknown", Value: bson.A{}}, {Key: "ok", Value: 1.0}})
}

// forgetChanges serves ForgetChangesCommand.
func (f *funnel) forgetChanges(c net.Conn, req []byte, cmd command) error {
	s := f.streams
	p, err := f.read(cmd.db, cmd.collection, 0, 0)
	if err != nil {
		return answer(c, req, cmd, refusal(1, "InternalError", ForgetChangesCommand+": "+err.Error()))
	}
	if p.uuid == noUUID {
		return answer(c, req, cmd, refusal(26, "NamespaceNotFound", fmt.Sprintf("%s: no collection %s.%s", ForgetChangesCommand, cmd.db, cmd.collection)))
	}
	s.mu.Lock()
	s.forgotten[p.uuid] = p.end
	s.mu.Unlock()
	return answer(c, req, cmd, bson.D{{Key: "forgottenThrough", Value: token(p.uuid, p.end)}, {Key: "ok", Value: 1.0}})
}

// serveStream serves the change-stream commands (and compact,
// renameCollection and the test commands) of a client; served is false
// for any other command. up returns the client's own upstream connection.
func (f *funnel) serveStream(c net.Conn, req []byte, cmd command, up func() (net.Conn, error)) (served bool, err error) {
	switch strings.ToLower(cmd.name) {
	case "aggregate":
		if _, err := cmd.msg.body().LookupErr("pipeline", "0", "$changeStream"); err != nil {
			return false, nil
		}
		return true, f.openStream(c, req, cmd)
	case "getmore":
		id, _ := cmd.msg.body().Lookup("getMore").Int64OK()
		f.streams.mu.Lock()
		cur := f.streams.cursors[id]
		f.streams.mu.Unlock()
		if cur == nil {
			return false, nil
		}
		u, err := up()
		if err != nil {
			return true, err
		}
		reply, err := f.batch(u, c, cmd, cur)
		if err != nil {
			return true, err
		}
		return true, answer(c, req, cmd, reply)
	case "killcursors":
		return f.killStreams(c, req, cmd)
	case "compact": // a full compaction runs VACUUM, which may renumber the rows streams are ordered by
		return true, answer(c, req, cmd, refusal(codeCommandNotSupported, "CommandNotSupported",
			"compact: refused by the embedded store: a full compaction runs SQLite's VACUUM, which may renumber the rows its change streams are ordered and resumed by"))
	case "renamecollection": // the service renames none
		return true, answer(c, req, cmd, refusal(codeCommandNotSupported, "CommandNotSupported",
			"renameCollection: refused by the embedded store, whose change streams and _id indexes know collections by name"))
	case strings.ToLower(ForgetChangesCommand):
		if !f.streams.testCommands {
			return false, nil
		}
		return true, f.forgetChanges(c, req, cmd)
	}
	return false, nil
}

// insertCommitted records what an insert command (cmd, answered with
// reply; nil when the answer did not parse) stored, and wakes the
// streams. Into a log (LogCollection, the one collection the service
// streams), the documents the reply says were stored go to the cache
// under the rowids they took, whether or not a stream is open, so that
// one opened later finds them: writes run one at a time and SQLite gives
// a new row the table's largest rowid plus one. That rowid is counted from insert to
// insert and read from the table only when not known: read after every
// insert, it cost 60 to 100 µs an insert of one commit, about a fifth of
// the insert (docs/embedded-store.md, "Why the change streams cache
// documents").
func (f *funnel) insertCommitted(cmd command, reply bson.Raw) {
	s := f.streams
	defer s.committed()
	if cmd.collection != LogCollection {
		return
	}
	stored, known := storedDocs(cmd, reply)
	if !known {
		s.cache.setEnd(cmd.db, cmd.collection, 0, false)
		return
	}
	if len(stored) == 0 { // a duplicate key, say: no row added
		return
	}
	end, ok := s.cache.end(cmd.db, cmd.collection)
	end += int64(len(stored))
	if !ok {
		p, err := f.read(cmd.db, cmd.collection, 0, 0)
		if err != nil || p.uuid == noUUID {
			f.log.Warn("embedded store change stream: the table's end not read; its events read their documents back",
				"db", cmd.db, "collection", cmd.collection, "err", err)
			return
		}
		end = p.end
	}
	first := end - int64(len(stored)) + 1
	for i, d := range stored {
		s.cache.put(cmd.db, cmd.collection, first+int64(i), bytes.Clone(d))
	}
	s.cache.setEnd(cmd.db, cmd.collection, end, true)
}

// storedDocs returns the documents of insert cmd that reply says were
// stored, in order; known is false when it does not say (no reply, a
// failed command, documents in the command's body rather than in a
// document sequence, as the driver sends them). An insert that stored
// none (a duplicate key) is known, with no documents.
func storedDocs(cmd command, reply bson.Raw) (stored []bson.Raw, known bool) {
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		return nil, false
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	failed := map[int64]bool{}
	errs, _ := reply.Lookup("writeErrors").ArrayOK()
	vals, _ := errs.Values()
	for _, v := range vals {
		d, _ := v.DocumentOK()
		i, _ := d.Lookup("index").AsInt64OK()
		failed[i] = true
	}
	for i, d := range cmd.msg.seqs["documents"] {
		if !failed[int64(i)] && int64(len(stored)) < n {
			stored = append(stored, d)
		}
	}
	return stored, int64(len(stored)) == n
}
