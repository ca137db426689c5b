package embedded

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Change streams. The outbox relay tails the event log with a MongoDB
// change stream (Collection.Watch); FerretDB 1.24 has none (its aggregate
// refuses the $changeStream stage). The funnel serves the shape the
// service uses, a stream of one collection's inserts, as MongoDB answers
// it, so the driver's Watch works on the embedded store unchanged:
//
//   - aggregate {pipeline: [{$changeStream: {...}}, {$match:
//     {operationType: "insert"}}]} on a collection opens a stream. The
//     $match is required: the funnel sees inserts only (an update or a
//     delete leaves no trace it could report), so a stream that would also
//     report other changes is refused with NotImplemented (238) rather
//     than answered without them. resumeAfter, startAfter,
//     startAtOperationTime and any fullDocument are accepted (an insert
//     event carries the whole document anyway); anything else in the stage
//     is refused;
//   - getMore on such a cursor answers the inserts after its position, or
//     waits for one up to maxTimeMS (1 s by default, MongoDB's awaitData
//     default) and is woken by the funnel when an insert into the
//     collection commits; killCursors closes it; a cursor is dropped when
//     the client connection that last used it closes (a getMore on it then
//     answers CursorNotFound, on which the driver resumes). A document an
//     upsert created is a row like any other and is reported as an
//     insert, as on MongoDB, but only an insert command wakes a waiting
//     getMore: it is reported at the next insert or when the wait ends;
//   - order and resume tokens are the store's own commit order: the rowid
//     of the collection's SQLite table (one writer; FerretDB writes a new
//     row at max(rowid)+1, so in an insert-only collection rowid order is
//     commit order) with the collection's uuid (FerretDB's
//     _ferretdb_collections.settings), so a token survives a restart and a
//     token of a dropped and re-created collection answers
//     ChangeStreamHistoryLost (286). A token is {_data: hex} of a version
//     byte, the uuid's 16 bytes and the rowid (8 bytes, big-endian);
//   - an event's clusterTime is its rowid as a Timestamp (T the high 32
//     bits, I the low 32): operation times of the embedded store are
//     positions in one collection, not a cluster-wide clock.
//     startAtOperationTime t starts at the event whose clusterTime is t
//     (inclusive, as on MongoDB); a time past the collection's end is
//     refused (BadValue), since it can only be a clock reading from
//     elsewhere;
//   - compact is refused: FerretDB runs VACUUM for a full compaction, and
//     VACUUM may renumber the rowids of a table without an INTEGER
//     PRIMARY KEY, which every non-capped FerretDB table is. No other
//     write path of FerretDB's SQLite backend renumbers rows (inserts
//     append, updates rewrite the document column in place, deletes
//     delete; renameCollection renames the metadata row and keeps the
//     table and uuid). A delete of the rows at the end of a table lets
//     SQLite reuse their rowids: change streams assume insert-only
//     collections, as the event log is.
//
// Documents: FerretDB stores its own JSON ("sjson") that only its internal
// packages decode, so the funnel keeps the raw BSON of the documents it
// saw inserted (docCache) and on a miss (after a restart, or a document
// pushed out of the cache) reads the document back from FerretDB by _id,
// which works for string, ObjectId, int and long _ids; another _id type
// on a miss is an error answer, never a wrong one. A document read back is
// the document as stored now: on a collection that was updated since, not
// the one inserted.

// Error codes from MongoDB's error_codes.yml.
const (
	codeCursorNotFound            = 43
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
)

// LogCollection is the collection of the event log (the mongodb
// package's CommitsCollection).
const LogCollection = "events"

// ForgetChangesCommand is the test command that makes the change-stream
// history of a collection unavailable, as when MongoDB's oplog has rolled
// past a resume token: {forgetChangesBefore: "<collection>", $db: "<db>"}
// forgets the collection's inserts up to its current end, so that a stream
// resuming from a position before that end answers ChangeStreamHistoryLost
// (286); one at the end (where a stream opened now starts) resumes. The funnel
// serves it only when the store was started WithTestCommands; the mark is
// kept in memory, so a restart forgets it.
const ForgetChangesCommand = "forgetChangesBefore"

// StoreOption configures StartStore.
type StoreOption func(*storeOptions)

type storeOptions struct {
	testCommands bool
}

// WithTestCommands makes the store serve its test commands
// (ForgetChangesCommand); without it they are unknown commands.
func WithTestCommands() StoreOption { return func(o *storeOptions) { o.testCommands = true } }

// streams is the funnel's change-stream state.
type streams struct {
	dir          string
	testCommands bool
	stop         chan struct{} // closed by the funnel's close: waiters return
	cache        docCache

	mu        sync.Mutex
	cursors   map[int64]*streamCursor
	wake      map[[2]string]chan struct{} // {db, coll}: closed and replaced at each committed insert
	forgotten map[string]int64            // uuid → the last forgotten rowid
	dbs       map[string]*sql.DB          // read-only handles, one per database file
}

// streamCursor is an open change stream.
type streamCursor struct {
	id       int64
	db, coll string
	uuid     [16]byte   // zero while the collection did not exist
	pos      int64      // the rowid reported last (or examined last)
	owner    net.Conn   // the client connection that used it last
	inUse    sync.Mutex // held by its getMore: one at a time, as on MongoDB
}

func newStreams(dir string, testCommands bool) *streams {
	return &streams{dir: dir, testCommands: testCommands, stop: make(chan struct{}),
		cursors: map[int64]*streamCursor{}, wake: map[[2]string]chan struct{}{},
		forgotten: map[string]int64{}, dbs: map[string]*sql.DB{}}
}

// close wakes every waiter and closes the read handles.
func (s *streams) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	for db, h := range s.dbs {
		_ = h.Close()
		delete(s.dbs, db)
	}
}

// committed wakes the streams of db.coll: an insert into it committed.
func (s *streams) committed(db, coll string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{db, coll}
	if ch, ok := s.wake[k]; ok {
		close(ch)
		delete(s.wake, k)
	}
}

// waitChan is closed at the next committed insert into db.coll.
func (s *streams) waitChan(db, coll string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{db, coll}
	ch, ok := s.wake[k]
	if !ok {
		ch = make(chan struct{})
		s.wake[k] = ch
	}
	return ch
}

// forgetDatabase closes the read handle of a database about to be dropped
// (its file is removed) and drops its cached documents.
func (s *streams) forgetDatabase(db string) {
	s.mu.Lock()
	if h := s.dbs[db]; h != nil {
		_ = h.Close()
		delete(s.dbs, db)
	}
	s.mu.Unlock()
	s.cache.dropCollection(db, "")
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

// handle returns the read-only handle of db's file, nil when the file does
// not exist.
func (s *streams) handle(db string) (*sql.DB, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.dbs[db]; h != nil {
		return h, nil
	}
	select {
	case <-s.stop:
		return nil, errors.New("the store is closing")
	default:
	}
	if db == "" || db != filepath.Base(db) || strings.ContainsAny(db, "?#") {
		return nil, fmt.Errorf("database name %q", db)
	}
	path := filepath.Join(s.dir, db+".sqlite")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	// A reader of its own: WAL lets it read while FerretDB writes.
	h, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	h.SetMaxOpenConns(4)
	s.dbs[db] = h
	return h, nil
}

// position is what one read of a collection's table found.
type position struct {
	exists bool
	uuid   [16]byte
	end    int64 // the largest rowid, 0 for an empty table
	rows   []row // after the position asked, in rowid order
}

// row is one document's place in its table and how to find its document.
type row struct {
	rowid int64
	id    idKey
}

// idKey is an _id as the cache and a read-back know it: its BSON type and
// a text form ("" type: an _id the funnel cannot name).
type idKey struct {
	kind byte // bson type: 0x02 string, 0x07 ObjectId, 0x10 int, 0x12 long
	text string
}

// read reads db.coll's identity, end and up to limit rows after rowid
// after, in one snapshot (a transaction of reads).
func (s *streams) read(ctx context.Context, db, coll string, after int64, limit int) (position, error) {
	var p position
	h, err := s.handle(db)
	if err != nil || h == nil {
		return p, err
	}
	tx, err := h.BeginTx(ctx, nil)
	if err != nil {
		return p, err
	}
	defer func() { _ = tx.Rollback() }()
	var table, id string
	err = tx.QueryRowContext(ctx, `SELECT table_name, coalesce(settings->>'$.uuid', '') FROM _ferretdb_collections WHERE name = ?`, coll).Scan(&table, &id)
	if errors.Is(err, sql.ErrNoRows) || isNoSuchTable(err) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	u, ok := parseUUID(id)
	if !ok {
		return p, fmt.Errorf("collection %s.%s: uuid %q", db, coll, id)
	}
	p.exists, p.uuid = true, u
	var end sql.NullInt64
	if err := tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT max(rowid) FROM %q`, table)).Scan(&end); err != nil {
		return p, err
	}
	p.end = end.Int64
	if limit <= 0 || after >= p.end {
		return p, nil
	}
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(`SELECT rowid, coalesce(_ferretdb_sjson->>'$._id', ''),
		coalesce(_ferretdb_sjson->>'$."$s".p._id.t', '') FROM %q WHERE rowid > ? ORDER BY rowid LIMIT ?`, table), after, limit)
	if err != nil {
		return p, err
	}
	defer rows.Close()
	for rows.Next() {
		var r row
		var text, typ string
		if err := rows.Scan(&r.rowid, &text, &typ); err != nil {
			return p, err
		}
		switch typ {
		case "string":
			r.id = idKey{kind: 0x02, text: text}
		case "objectId":
			r.id = idKey{kind: 0x07, text: text}
		case "int", "long":
			r.id = idKey{kind: 0x12, text: text} // int and long of one value are one _id
		}
		p.rows = append(p.rows, r)
	}
	return p, rows.Err()
}

func parseUUID(s string) ([16]byte, bool) {
	var u [16]byte
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(b) != 16 {
		return u, false
	}
	copy(u[:], b)
	return u, true
}

// keyOf is the idKey of an _id value, false for a type a read-back cannot
// name.
func keyOf(v bson.RawValue) (idKey, bool) {
	switch v.Type {
	case bson.TypeString:
		return idKey{kind: 0x02, text: v.StringValue()}, true
	case bson.TypeObjectID:
		return idKey{kind: 0x07, text: v.ObjectID().Hex()}, true
	case bson.TypeInt32:
		return idKey{kind: 0x12, text: strconv.FormatInt(int64(v.Int32()), 10)}, true
	case bson.TypeInt64:
		return idKey{kind: 0x12, text: strconv.FormatInt(v.Int64(), 10)}, true
	}
	return idKey{}, false
}

// value is the _id k names, for a find.
func (k idKey) value() (any, bool) {
	switch k.kind {
	case 0x02:
		return k.text, true
	case 0x07:
		oid, err := bson.ObjectIDFromHex(k.text)
		return oid, err == nil
	case 0x12:
		n, err := strconv.ParseInt(k.text, 10, 64)
		if err != nil {
			return nil, false
		}
		if n >= math.MinInt32 && n <= math.MaxInt32 {
			return int32(n), true
		}
		return n, true
	}
	return nil, false
}

// token is a resume token: {_data: hex(version, uuid, rowid)}.
func token(uuid [16]byte, rowid int64) bson.D {
	b := make([]byte, 0, tokenLen)
	b = append(b, tokenVersion)
	b = append(b, uuid[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(rowid))
	return bson.D{{Key: "_data", Value: hex.EncodeToString(b)}}
}

// parseToken reads a token the funnel issued.
func parseToken(v bson.RawValue) (uuid [16]byte, rowid int64, ok bool) {
	d, isDoc := v.DocumentOK()
	if !isDoc {
		return uuid, 0, false
	}
	s, _ := d.Lookup("_data").StringValueOK()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != tokenLen || b[0] != tokenVersion {
		return uuid, 0, false
	}
	copy(uuid[:], b[1:17])
	rowid = int64(binary.BigEndian.Uint64(b[17:]))
	return uuid, rowid, rowid >= 0
}

// clusterTime is an event's operation time: its rowid.
func clusterTime(rowid int64) bson.Timestamp {
	return bson.Timestamp{T: uint32(uint64(rowid) >> 32), I: uint32(rowid)}
}

// isChangeStream reports whether an aggregate's pipeline starts with
// $changeStream.
func isChangeStream(body bson.Raw) bool {
	p, ok := body.Lookup("pipeline").ArrayOK()
	if !ok {
		return false
	}
	stages, err := p.Values()
	if err != nil || len(stages) == 0 {
		return false
	}
	stage, ok := stages[0].DocumentOK()
	if !ok {
		return false
	}
	_, err = stage.LookupErr("$changeStream")
	return err == nil
}

// insertsOnly reports whether stages (those after $changeStream) are
// exactly one $match selecting inserts by operationType.
func insertsOnly(stages []bson.RawValue) bool {
	if len(stages) != 1 {
		return false
	}
	stage, ok := stages[0].DocumentOK()
	if !ok {
		return false
	}
	elems, err := stage.Elements()
	if err != nil || len(elems) != 1 || elems[0].Key() != "$match" {
		return false
	}
	match, ok := elems[0].Value().DocumentOK()
	if !ok {
		return false
	}
	conds, err := match.Elements()
	if err != nil || len(conds) != 1 || conds[0].Key() != "operationType" {
		return false
	}
	v := conds[0].Value()
	if s, ok := v.StringValueOK(); ok {
		return s == "insert"
	}
	op, ok := v.DocumentOK()
	if !ok {
		return false
	}
	ops, err := op.Elements()
	if err != nil || len(ops) != 1 {
		return false
	}
	switch ops[0].Key() {
	case "$eq":
		s, _ := ops[0].Value().StringValueOK()
		return s == "insert"
	case "$in":
		arr, ok := ops[0].Value().ArrayOK()
		if !ok {
			return false
		}
		vals, err := arr.Values()
		if err != nil || len(vals) != 1 {
			return false
		}
		s, _ := vals[0].StringValueOK()
		return s == "insert"
	}
	return false
}

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
	stages, err := arr.Values()
	if err != nil || len(stages) == 0 {
		return refuse(codeBadValue, "BadValue", "pipeline: not an array of stages")
	}
	if !insertsOnly(stages[1:]) {
		return refuse(codeNotImplemented, "NotImplemented",
			`$changeStream: the embedded store reports inserts only; add {$match: {operationType: "insert"}} as the stream's only other stage`)
	}
	stage, _ := stages[0].Document().Lookup("$changeStream").DocumentOK()
	elems, err := stage.Elements()
	if err != nil {
		return refuse(codeBadValue, "BadValue", "$changeStream: options must be a document")
	}
	var resume *bson.RawValue
	var at *bson.Timestamp
	for _, e := range elems {
		v := e.Value()
		switch e.Key() {
		case "resumeAfter", "startAfter":
			if resume != nil {
				return refuse(codeBadValue, "BadValue", "$changeStream: only one of resumeAfter and startAfter may be given")
			}
			resume = &v
		case "startAtOperationTime":
			t, i, ok := v.TimestampOK()
			if !ok {
				return refuse(codeBadValue, "BadValue", "$changeStream: startAtOperationTime must be a timestamp")
			}
			at = &bson.Timestamp{T: t, I: i}
		case "fullDocument":
			// Every mode answers an insert with its whole document.
		case "fullDocumentBeforeChange":
			if m, _ := v.StringValueOK(); m != "off" {
				return refuse(codeNotImplemented, "NotImplemented", "$changeStream: the embedded store has no pre-images (fullDocumentBeforeChange)")
			}
		case "showExpandedEvents":
			if b, _ := v.BooleanOK(); b {
				return refuse(codeNotImplemented, "NotImplemented", "$changeStream: the embedded store reports inserts only (showExpandedEvents)")
			}
		default:
			return refuse(codeNotImplemented, "NotImplemented", "$changeStream: the embedded store does not serve option "+e.Key())
		}
	}
	if resume != nil && at != nil {
		return refuse(codeBadValue, "BadValue", "$changeStream: only one of resumeAfter, startAfter and startAtOperationTime may be given")
	}
	p, err := s.read(context.Background(), cmd.db, cmd.collection, 0, 0)
	if err != nil {
		return refuse(1, "InternalError", "$changeStream: "+err.Error())
	}
	cur := &streamCursor{db: cmd.db, coll: cmd.collection, uuid: p.uuid, pos: p.end, owner: c}
	resumed := false
	switch {
	case resume != nil:
		u, rowid, ok := parseToken(*resume)
		if !ok {
			return refuse(codeInvalidResumeToken, "InvalidResumeToken", "$changeStream: not a resume token of the embedded store")
		}
		if u != ([16]byte{}) && (!p.exists || u != p.uuid) {
			return refuse(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("$changeStream: the resume token is of another incarnation of %s.%s (dropped or re-created since)", cmd.db, cmd.collection))
		}
		if u == ([16]byte{}) && rowid != 0 {
			return refuse(codeInvalidResumeToken, "InvalidResumeToken", "$changeStream: not a resume token of the embedded store")
		}
		cur.pos, resumed = rowid, true
	case at != nil:
		first := int64(uint64(at.T)<<32 | uint64(at.I))
		if first-1 > p.end {
			return refuse(codeBadValue, "BadValue", fmt.Sprintf(
				"$changeStream: startAtOperationTime %d.%d is past the end of %s.%s: the embedded store's operation times are positions in one collection (an event's clusterTime), not a clock",
				at.T, at.I, cmd.db, cmd.collection))
		}
		cur.pos, resumed = max(first-1, 0), true
	}
	if resumed && p.exists {
		s.mu.Lock()
		w, ok := s.forgotten[string(p.uuid[:])]
		s.mu.Unlock()
		// A position before the mark needs events the store forgot; one at
		// it needs none of them, as a stream opened after the forgetting.
		if ok && cur.pos < w {
			return refuse(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("$changeStream: the history of %s.%s up to the resume point was forgotten (%s)", cmd.db, cmd.collection, ForgetChangesCommand))
		}
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cur.id = int64(binary.LittleEndian.Uint64(b[:]) &^ (1 << 63))
		if cur.id == 0 {
			continue
		}
		s.mu.Lock()
		_, taken := s.cursors[cur.id]
		if !taken {
			s.cursors[cur.id] = cur
		}
		s.mu.Unlock()
		if !taken {
			break
		}
	}
	// An empty first batch, as MongoDB's usually is, and no operationTime:
	// the driver resumes from a token when it has one and from the
	// initial aggregate's operationTime only when it has none
	// (mongo/change_stream.go, executeOperation and replaceOptions), and
	// it keeps the postBatchResumeToken of this empty batch as its token.
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

// streamCursorOf returns the funnel's cursor a getMore names, nil when it
// is not one of the funnel's.
func (s *streams) cursorOf(body bson.Raw) *streamCursor {
	id, ok := body.Lookup("getMore").Int64OK()
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursors[id]
}

// nextBatch serves a getMore of the stream cur on c; up is the client's
// own upstream connection, for reading documents back.
func (f *funnel) nextBatch(up, c net.Conn, req []byte, cmd command, cur *streamCursor) error {
	s := f.streams
	body := cmd.msg.body()
	if coll, _ := body.Lookup("collection").StringValueOK(); coll != cur.coll || cmd.db != cur.db {
		return answer(c, req, cmd, refusal(13, "Unauthorized", fmt.Sprintf("cursor %d is of %s.%s", cur.id, cur.db, cur.coll)))
	}
	if !cur.inUse.TryLock() {
		return answer(c, req, cmd, refusal(codeCursorInUse, "CursorInUse", fmt.Sprintf("cursor %d is in use by another getMore", cur.id)))
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
		woken := s.waitChan(cur.db, cur.coll) // before the read: no commit is missed
		p, err := s.read(context.Background(), cur.db, cur.coll, cur.pos, limit)
		if err != nil {
			return answer(c, req, cmd, refusal(1, "InternalError", "getMore: "+err.Error()))
		}
		if p.exists && cur.uuid == ([16]byte{}) && cur.pos == 0 {
			cur.uuid = p.uuid // created since the stream opened
		}
		if !p.exists && cur.uuid != ([16]byte{}) || p.exists && p.uuid != cur.uuid {
			s.mu.Lock()
			delete(s.cursors, cur.id)
			s.mu.Unlock()
			return answer(c, req, cmd, refusal(codeChangeStreamHistLost, "ChangeStreamHistoryLost",
				fmt.Sprintf("getMore: %s.%s was dropped or re-created since the stream opened", cur.db, cur.coll)))
		}
		if len(p.rows) > 0 {
			events, err := f.events(up, cur, p.rows)
			if err != nil {
				return err
			}
			if events == nil {
				return answer(c, req, cmd, refusal(1, "InternalError", "getMore: "+errReadBack.Error()))
			}
			return answer(c, req, cmd, cursorReply(cur, "nextBatch", events))
		}
		if p.end > cur.pos {
			cur.pos = p.end
		}
		select {
		case <-woken:
			continue
		case <-deadline.C:
		case <-s.stop:
		}
		return answer(c, req, cmd, cursorReply(cur, "nextBatch", bson.A{}))
	}
}

var errReadBack = errors.New("a document of the stream could not be read back from the store")

// events builds the insert events of rows, advancing cur past those it
// reports (up to maxBatchBytes, and up to a document it cannot read
// back). A nil slice with no error means the first row's document could
// not be read back; an error means up failed.
func (f *funnel) events(up net.Conn, cur *streamCursor, rows []row) (bson.A, error) {
	out := bson.A{}
	size := 0
	ns := bson.D{{Key: "db", Value: cur.db}, {Key: "coll", Value: cur.coll}}
	for _, r := range rows {
		raw, at, ok := f.streams.cache.get(cur.db, cur.coll, r.id)
		doc := bson.Raw(raw)
		if !ok {
			var err error
			doc, err = readBack(up, cur.db, cur.coll, r.id)
			if err != nil {
				return nil, err
			}
			if doc == nil {
				if len(out) > 0 {
					break // the events before it; the next getMore fails on it
				}
				f.log.Warn("embedded store change stream: document not read back", "db", cur.db, "collection", cur.coll, "rowid", r.rowid)
				return nil, nil
			}
			at = time.Now()
		}
		if size > 0 && size+len(doc) > maxBatchBytes {
			break
		}
		size += len(doc)
		out = append(out, bson.D{
			{Key: "_id", Value: token(cur.uuid, r.rowid)},
			{Key: "operationType", Value: "insert"},
			{Key: "clusterTime", Value: clusterTime(r.rowid)},
			{Key: "wallTime", Value: bson.NewDateTimeFromTime(at)},
			{Key: "ns", Value: ns},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: doc.Lookup("_id")}}},
			{Key: "fullDocument", Value: doc},
		})
		cur.pos = r.rowid
	}
	return out, nil
}

// readBack reads one document from FerretDB by _id on up; nil when it
// cannot (an _id type the funnel cannot name, or none found).
func readBack(up net.Conn, db, coll string, k idKey) (bson.Raw, error) {
	id, ok := k.value()
	if !ok {
		return nil, nil
	}
	reply, err := roundTrip(up, bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: id}}},
		{Key: "limit", Value: int64(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: db}})
	if err != nil {
		return nil, err
	}
	docs := firstBatch(reply)
	if len(docs) == 0 {
		return nil, nil
	}
	return bytes.Clone(docs[0]), nil
}

// killStreams serves a killCursors naming the funnel's cursors; handled is
// false when it names none (it is relayed as it is).
func (f *funnel) killStreams(up, c net.Conn, req []byte, cmd command) (handled bool, err error) {
	s := f.streams
	body := cmd.msg.body()
	arr, ok := body.Lookup("cursors").ArrayOK()
	if !ok {
		return false, nil
	}
	vals, _ := arr.Values()
	var killed, others bson.A
	s.mu.Lock()
	for _, v := range vals {
		id, ok := v.Int64OK()
		if cur := s.cursors[id]; ok && cur != nil && cur.db == cmd.db && cur.coll == cmd.collection {
			delete(s.cursors, id)
			killed = append(killed, id)
		} else {
			others = append(others, v)
		}
	}
	s.mu.Unlock()
	if len(killed) == 0 {
		return false, nil
	}
	reply := bson.D{{Key: "cursorsKilled", Value: killed}, {Key: "cursorsNotFound", Value: bson.A{}},
		{Key: "cursorsAlive", Value: bson.A{}}, {Key: "cursorsUnknown", Value: bson.A{}}, {Key: "ok", Value: 1.0}}
	if len(others) > 0 {
		theirs, err := roundTrip(up, bson.D{{Key: "killCursors", Value: cmd.collection}, {Key: "cursors", Value: others}, {Key: "$db", Value: cmd.db}})
		if err != nil {
			return true, err
		}
		for i, field := range []string{"cursorsKilled", "cursorsNotFound", "cursorsAlive", "cursorsUnknown"} {
			if a, ok := theirs.Lookup(field).ArrayOK(); ok {
				vs, _ := a.Values()
				for _, v := range vs {
					reply[i].Value = append(reply[i].Value.(bson.A), v)
				}
			}
		}
	}
	return true, answer(c, req, cmd, reply)
}

// forgetChanges serves ForgetChangesCommand.
func (f *funnel) forgetChanges(c net.Conn, req []byte, cmd command) error {
	s := f.streams
	p, err := s.read(context.Background(), cmd.db, cmd.collection, 0, 0)
	if err != nil {
		return answer(c, req, cmd, refusal(1, "InternalError", ForgetChangesCommand+": "+err.Error()))
	}
	if !p.exists {
		return answer(c, req, cmd, refusal(26, "NamespaceNotFound", fmt.Sprintf("%s: no collection %s.%s", ForgetChangesCommand, cmd.db, cmd.collection)))
	}
	s.mu.Lock()
	s.forgotten[string(p.uuid[:])] = p.end
	s.mu.Unlock()
	return answer(c, req, cmd, bson.D{{Key: "forgottenThrough", Value: token(p.uuid, p.end)}, {Key: "ok", Value: 1.0}})
}

// refuseCompact answers compact, which could renumber the rows change
// streams are ordered by (see the top of this file).
func refuseCompact(c net.Conn, req []byte, cmd command) error {
	return answer(c, req, cmd, refusal(codeCommandNotSupported, "CommandNotSupported",
		"compact: refused by the embedded store: a full compaction runs SQLite's VACUUM, which may renumber the rows its change streams are ordered and resumed by"))
}

// serveStream serves the change-stream commands (and compact and the
// test commands) of a client; served is false for any other command. up
// returns the client's own upstream connection.
func (f *funnel) serveStream(c net.Conn, req []byte, cmd command, up func() (net.Conn, error)) (served bool, err error) {
	switch strings.ToLower(cmd.name) {
	case "aggregate":
		if !isChangeStream(cmd.msg.body()) {
			return false, nil
		}
		return true, f.openStream(c, req, cmd)
	case "getmore":
		cur := f.streams.cursorOf(cmd.msg.body())
		if cur == nil {
			return false, nil
		}
		u, err := up()
		if err != nil {
			return true, err
		}
		return true, f.nextBatch(u, c, req, cmd, cur)
	case "killcursors":
		u, err := up()
		if err != nil {
			return true, err
		}
		return f.killStreams(u, c, req, cmd)
	case "compact":
		return true, refuseCompact(c, req, cmd)
	case strings.ToLower(ForgetChangesCommand):
		if !f.streams.testCommands {
			return false, nil
		}
		return true, f.forgetChanges(c, req, cmd)
	}
	return false, nil
}

// insertCommitted records what an insert command (cmd, answered with
// reply; nil when the client asked for no answer) stored: the documents
// it stored go to the cache, and the streams of the collection are woken.
func (f *funnel) insertCommitted(cmd command, reply bson.Raw) {
	s := f.streams
	var docs []bson.Raw
	for _, sec := range cmd.msg.sections {
		if sec.kind == 1 && sec.identifier == "documents" {
			docs = append(docs, sec.docs...)
		}
	}
	if arr, ok := cmd.msg.body().Lookup("documents").ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, ok := v.DocumentOK(); ok {
				docs = append(docs, d)
			}
		}
	}
	if reply == nil {
		// Unacknowledged: which documents were stored is unknown; none is
		// cached, and any cached under their _ids goes (a read-back finds
		// what was stored).
		for _, d := range docs {
			if k, ok := keyOf(d.Lookup("_id")); ok {
				s.cache.remove(cmd.db, cmd.collection, k)
			}
		}
		s.committed(cmd.db, cmd.collection)
		return
	}
	n, _ := reply.Lookup("n").AsInt64OK()
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 || n < 1 {
		return
	}
	failed := map[int]bool{}
	first := len(docs)
	if errs, ok := reply.Lookup("writeErrors").ArrayOK(); ok {
		vals, _ := errs.Values()
		for _, v := range vals {
			we, _ := v.DocumentOK()
			i, ok := we.Lookup("index").AsInt64OK()
			if !ok {
				first = 0 // a write error the funnel cannot place: cache nothing
				continue
			}
			failed[int(i)] = true
			first = min(first, int(i))
		}
	}
	ordered := true
	if b, ok := cmd.msg.body().Lookup("ordered").BooleanOK(); ok {
		ordered = b
	}
	var stored []int
	for i := range docs {
		if failed[i] || ordered && i >= first {
			continue
		}
		stored = append(stored, i)
	}
	// FerretDB may store an ordered insert's documents past its first
	// error; those are read back when streamed. An n that does not match
	// means the funnel misread the answer: nothing is cached.
	if !ordered && int64(len(stored)) != n || ordered && int64(len(stored)) > n {
		stored = nil
	}
	cached := map[int]bool{}
	for _, i := range stored {
		cached[i] = true
	}
	for i, d := range docs {
		// Stored or not, unknown: what is cached under its _id may be an
		// earlier document's (a duplicate-key loser's _id is the winner's,
		// whose entry stays).
		if !cached[i] && !failed[i] {
			if k, ok := keyOf(d.Lookup("_id")); ok {
				s.cache.remove(cmd.db, cmd.collection, k)
			}
		}
	}
	if !s.watched(cmd.db, cmd.collection) {
		// No stream reads this collection: its inserts (a rebuild's bulk
		// loads, a read model's documents) would only push the watched
		// ones out of the cache, and hold the memory of a whole load. A
		// stream opened later reads them back.
		s.committed(cmd.db, cmd.collection)
		return
	}
	now := time.Now()
	for _, i := range stored {
		if k, ok := keyOf(docs[i].Lookup("_id")); ok {
			s.cache.put(cmd.db, cmd.collection, k, bytes.Clone(docs[i]), now)
		}
	}
	s.committed(cmd.db, cmd.collection)
}

// watched reports whether a change stream is open on collection coll of
// db.
func (s *streams) watched(db, coll string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cur := range s.cursors {
		if cur.db == db && cur.coll == coll {
			return true
		}
	}
	return false
}
