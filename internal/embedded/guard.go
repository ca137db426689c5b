package embedded

import (
	"bytes"
	"cmp"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/FerretDB/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Guarded updates ({_id: v, version: {$lt: 7}}), which FerretDB 1.24
// evaluates in Go over the whole collection, and answers as a bulk that
// stops at its first error: the funnel, which runs every write alone,
// serves them with MongoDB's answers (docs/embedded-store.md, "Guarded
// updates at index speed"). Statements it cannot judge (guardOf) leave the
// command to FerretDB.

// guardedUpdate is one statement of an update command the funnel serves.
type guardedUpdate struct {
	stmt   bson.D // the statement with q reduced to {_id: id}
	size   int    // the statement's bytes as the client sent it
	id     bson.RawValue
	guard  bson.Raw // the other top-level conditions of q
	upsert bool
}

// guardedUpdates returns the statements of an update request when every one
// can be served by the funnel (guardOf), and whether the command is
// ordered. ok is false otherwise, and for a request of at most maxUpdate
// statements with no guard at all (FerretDB serves {_id: v} at index speed
// already). Statements in the body rather than in a document sequence, as
// the driver sends them, leave the update to FerretDB.
func guardedUpdates(m *opMsg) (stmts []guardedUpdate, ordered bool, ok bool) {
	guarded := false
	for _, s := range m.sections {
		for _, r := range s.docs {
			if s.identifier != "updates" {
				continue
			}
			g, ok := guardOf(r)
			if !ok {
				return nil, false, false
			}
			guarded = guarded || len(g.guard) > 5
			stmts = append(stmts, g)
		}
	}
	ordered, isBool := m.body().Lookup("ordered").BooleanOK()
	return stmts, ordered || !isBool, guarded || len(stmts) > maxUpdate
}

// guardOf splits one update statement into its _id and its guard. It
// refuses (ok false) multi updates, a q without a string _id,
// conditions that are not equalities or operator documents of $eq and $lt
// (what the service sends: a read model's {version: {$lt: v}}, a verify's
// repair on {version: {$eq: v}}, a lease's fence on its owner and epoch)
// on numbers and strings, a field whose name is no plain identifier
// (fieldName), and, with upsert, a plain equality beyond _id (an upsert
// copies it into the document it inserts).
func guardOf(stmt bson.Raw) (g guardedUpdate, ok bool) {
	q, isDoc := stmt.Lookup("q").DocumentOK()
	elems, err := q.Elements()
	if multi, _ := stmt.Lookup("multi").BooleanOK(); multi || !isDoc || err != nil {
		return g, false
	}
	g.upsert, _ = stmt.Lookup("upsert").BooleanOK()
	g.size = len(stmt)
	guard := bson.D{}
	for _, e := range elems {
		k, v := e.Key(), e.Value()
		ops, isOps := v.DocumentOK()
		opElems, _ := ops.Elements()
		switch {
		case k == "_id" && v.Type == bson.TypeString:
			g.id = v
		case k == "_id" || !fieldName.MatchString(k): // storedGuards names it in SQL
			return g, false
		case !isOps && !g.upsert && scalar(v):
			guard = append(guard, bson.E{Key: k, Value: bson.D{{Key: "$eq", Value: v}}})
		case len(opElems) > 0 && !slices.ContainsFunc(opElems, func(op bson.RawElement) bool {
			_, known := comparisons[op.Key()]
			return !known || !scalar(op.Value())
		}):
			guard = append(guard, bson.E{Key: k, Value: v})
		default:
			return g, false
		}
	}
	g.guard, err = bson.Marshal(guard)
	if g.id.Type == 0 || err != nil || bson.Unmarshal(stmt, &g.stmt) != nil {
		return g, false
	}
	for i := range g.stmt {
		if g.stmt[i].Key == "q" {
			g.stmt[i].Value = bson.D{{Key: "_id", Value: g.id}}
		}
	}
	return g, true
}

// comparisons are the operators a guard may use, each as the signs of a
// comparison of the stored value with the operand that satisfy it.
var comparisons = map[string][]int{"$eq": {0}, "$lt": {-1}}

func scalar(v bson.RawValue) bool {
	_, isNumber := number(v)
	return isNumber || v.Type == bson.TypeString
}

// holds reports whether doc satisfies guard, as MongoDB would with its
// default collation: numbers compare across int32, int64 and double;
// values of different kinds, or a missing field, never satisfy it.
func holds(doc, guard bson.Raw) bool {
	elems, _ := guard.Elements()
	for _, e := range elems {
		stored, err := doc.LookupErr(e.Key())
		ops, _ := e.Value().Document().Elements()
		for _, op := range ops {
			c, comparable := 0, false
			if err == nil {
				c, comparable = compare(stored, op.Value())
			}
			if !comparable || !slices.Contains(comparisons[op.Key()], c) {
				return false
			}
		}
	}
	return true
}

// compare orders a before b (-1), equal (0) or after (1); comparable is
// false for values of different kinds.
func compare(a, b bson.RawValue) (c int, comparable bool) {
	fa, aNumber := number(a)
	fb, bNumber := number(b)
	switch {
	case aNumber && bNumber:
		// Versions and counts are int64: compare them exactly when both are.
		ia, aInt := a.AsInt64OK()
		ib, bInt := b.AsInt64OK()
		if aInt && bInt && a.Type != bson.TypeDouble && b.Type != bson.TypeDouble {
			return cmp.Compare(ia, ib), true
		}
		return cmp.Compare(fa, fb), true
	case a.Type == bson.TypeString && b.Type == bson.TypeString:
		return strings.Compare(a.StringValue(), b.StringValue()), true
	}
	return 0, false
}

func number(v bson.RawValue) (float64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return float64(v.Int32()), true
	case bson.TypeInt64:
		return float64(v.Int64()), true
	case bson.TypeDouble:
		return v.Double(), true
	}
	return 0, false
}

// requestIDs numbers the funnel's own requests to FerretDB.
var requestIDs atomic.Int32

// opMessage is an OP_MSG with body as its one section, answering
// responseTo (0 for a request). Built here, not with wire v0.0.7's
// NewOpMsg and MarshalBinary, which decode body once more (their
// debugbuild check) and still leave the header to write by hand.
func opMessage(body bson.Raw, responseTo int32) []byte {
	msg := make([]byte, 0, headerLen+5+len(body))
	msg = binary.LittleEndian.AppendUint32(msg, 0) // length, set below
	msg = binary.LittleEndian.AppendUint32(msg, uint32(requestIDs.Add(1)))
	msg = binary.LittleEndian.AppendUint32(msg, uint32(responseTo))
	msg = binary.LittleEndian.AppendUint32(msg, uint32(wire.OpCodeMsg))
	msg = binary.LittleEndian.AppendUint32(msg, 0) // flags
	msg = append(msg, 0)                           // kind 0: body
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
	return msg
}

// roundTrip sends one command to FerretDB on up and returns its reply's body.
func roundTrip(up net.Conn, cmd bson.D) (bson.Raw, error) {
	body, err := bson.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	if _, err := up.Write(opMessage(body, 0)); err != nil {
		return nil, err
	}
	resp, err := readMessage(up)
	if err != nil {
		return nil, err
	}
	out := parseOpMsg(resp).body()
	if out == nil {
		return nil, errors.New("store reply without a body")
	}
	return out, nil
}

// serveGuarded runs the statements of an update command of db.coll (from
// guardedUpdates) on up, which the caller holds alone, and returns
// MongoDB's reply: n, nModified, upserted with statement indexes, and
// writeErrors (a failed guard under upsert is E11000 on _id). An ordered
// command stops at its first write error.
//
// The statements go in runs of distinct _ids, each run's guards read in
// one indexed query (storedGuards): a statement per command, a find and an
// update, cost 1.6 ms, a run of 32 0.5 ms a statement (docs/embedded-store.md,
// "Guarded updates at index speed"). Only the store itself can then fail a
// statement, and its answer is the command's. An error means up failed.
func serveGuarded(up net.Conn, h *sql.DB, db, coll string, stmts []guardedUpdate, ordered bool) (bson.Raw, error) {
	var n, modified int32
	var upserted, writeErrors bson.A
	for from := 0; from < len(stmts); {
		to, seen, size := from, map[string]bool{}, 0
		for ; to < len(stmts) && !seen[string(stmts[to].id.Value)] && to-from < maxRun && size < maxBatchBytes; to++ {
			seen[string(stmts[to].id.Value)] = true
			size += stmts[to].size
		}
		stored, err := storedGuards(h, coll, stmts[from:to])
		if err != nil {
			return nil, err
		}
		var send, inserts bson.A
		var inserted, replaced []int // the statements of inserts, of replacements of stored documents
		byID := map[string]int{}     // a sent statement's index by its _id's JSON text
		stop := false
		for i := from; i < to && !stop; i++ {
			st := stmts[i]
			doc, found := stored[idText(st.id)]
			switch {
			case found && !holds(doc, st.guard) && st.upsert:
				writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(11000)},
					{Key: "errmsg", Value: fmt.Sprintf("E11000 duplicate key error collection: %s.%s index: _id_ dup key: { _id: %s }", db, coll, st.id)}})
				stop = ordered
			case found && !holds(doc, st.guard), !found && !st.upsert:
				// matches nothing
			case !found && insertable(st):
				inserts = append(inserts, field(st.stmt, "u"))
				inserted = append(inserted, i)
			case insertable(st):
				replaced = append(replaced, i)
			default:
				byID[idText(st.id)] = i
				send = append(send, st.stmt)
			}
		}
		if len(inserts) > 0 {
			reply, stored, err := insertAll(up, db, coll, inserts)
			if err != nil || !stored {
				return reply, err
			}
			for _, i := range inserted {
				upserted = append(upserted, bson.D{{Key: "index", Value: int32(i)}, {Key: "_id", Value: stmts[i].id}})
				n++
			}
		}
		if len(replaced) > 0 {
			changed, ok, err := replaceRows(up, h, db, coll, stmts, replaced)
			switch {
			case err != nil:
				return nil, err
			case ok:
				n += int32(len(replaced))
				modified += int32(changed)
			default:
				for _, i := range replaced {
					byID[idText(stmts[i].id)] = i
					send = append(send, stmts[i].stmt)
				}
			}
		}
		for len(send) > 0 {
			chunk := send[:min(len(send), maxUpdate)]
			send = send[len(chunk):]
			reply, err := roundTrip(up, bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: chunk},
				{Key: "ordered", Value: true}, {Key: "$db", Value: db}})
			if err != nil {
				return nil, err
			}
			if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
				return reply, nil
			}
			m, _ := reply.Lookup("n").AsInt64OK()
			nm, _ := reply.Lookup("nModified").AsInt64OK()
			n += int32(m)
			modified += int32(nm)
			ups, _ := reply.Lookup("upserted").ArrayOK()
			vals, _ := ups.Values()
			for _, v := range vals {
				id := v.Document().Lookup("_id")
				upserted = append(upserted, bson.D{{Key: "index", Value: int32(byID[idText(id)])}, {Key: "_id", Value: id}})
			}
		}
		if stop {
			break
		}
		from = to
	}
	out := bson.D{{Key: "n", Value: n}, {Key: "nModified", Value: modified}}
	if len(upserted) > 0 {
		out = append(out, bson.E{Key: "upserted", Value: upserted})
	}
	if len(writeErrors) > 0 {
		out = append(out, bson.E{Key: "writeErrors", Value: writeErrors})
	}
	out = append(out, bson.E{Key: "ok", Value: 1.0})
	return bson.Marshal(out)
}

// insertAll inserts docs into db.coll on up in one ordered insert; stored
// is false when FerretDB did not store them all, and reply is its answer.
func insertAll(up net.Conn, db, coll string, docs bson.A) (reply bson.Raw, stored bool, err error) {
	reply, err = roundTrip(up, bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: docs},
		{Key: "ordered", Value: true}, {Key: "$db", Value: db}})
	ok, _ := reply.Lookup("ok").AsFloat64OK()
	return reply, err == nil && ok == 1 && reply.Lookup("writeErrors").Type == 0, err
}

// replacements is the collection in which replaceRows has FerretDB
// encode the documents it writes.
const replacements = "_funnel_replacements"

// replaceRows writes the replacements stmts[idx] of stored documents
// whose guards hold as rows: FerretDB inserts (and so encodes) the
// documents into the replacements collection, and one SQL UPDATE copies
// their rows over the stored ones with the same _id, as FerretDB's own
// update writes a row, and empties it: 140 to 158 µs a statement against
// 432 to 457 µs as FerretDB's update (docs/embedded-store.md, "Guarded
// updates at index speed"). It returns how many rows changed (MongoDB's
// nModified), and ok false when it wrote nothing: the statements then go
// to FerretDB, which answers for them. An error means up failed.
func replaceRows(up net.Conn, h *sql.DB, db, coll string, stmts []guardedUpdate, idx []int) (changed int64, ok bool, err error) {
	if h == nil || coll == replacements {
		return 0, false, nil
	}
	table, _, err := tableOf(h, coll)
	if err != nil || table == "" {
		return 0, false, nil
	}
	// Rows a write that failed halfway left would be copied too.
	scratch, _, err := tableOf(h, replacements)
	if err != nil {
		return 0, false, nil
	}
	var left bool
	if scratch != "" {
		err := h.QueryRow(fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %q)`, scratch)).Scan(&left)
		if err == nil && left {
			_, err = h.Exec(fmt.Sprintf(`DELETE FROM %q`, scratch))
		}
		if err != nil {
			return 0, false, nil
		}
	}
	docs := make(bson.A, len(idx))
	for k, i := range idx {
		docs[k] = field(stmts[i].stmt, "u")
	}
	if _, stored, err := insertAll(up, db, replacements, docs); err != nil || !stored {
		return 0, false, err
	}
	if scratch == "" {
		if scratch, _, err = tableOf(h, replacements); err != nil || scratch == "" {
			return 0, false, nil
		}
	}
	tx, err := h.Begin()
	if err != nil {
		return 0, false, nil
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.Exec(fmt.Sprintf(`UPDATE %[1]q SET _ferretdb_sjson = s._ferretdb_sjson FROM %[2]q AS s
		WHERE %[1]q.%[3]s = s.%[3]s AND %[1]q._ferretdb_sjson IS NOT s._ferretdb_sjson`, table, scratch, idJSON))
	if err != nil {
		return 0, false, nil
	}
	if _, err := tx.Exec(fmt.Sprintf(`DELETE FROM %q`, scratch)); err != nil {
		return 0, false, nil
	}
	if err := tx.Commit(); err != nil {
		return 0, false, nil
	}
	changed, _ = res.RowsAffected()
	return changed, true, nil
}

// insertable reports whether a statement's document can be written
// whole, as an insert or a row (replaceRows): its u is a replacement that
// starts with the statement's _id, as a read model's document does. A
// batch of inserts costs FerretDB 0.07 ms a document, an update 0.5 ms a
// statement (docs/embedded-store.md, "Guarded updates at index speed").
func insertable(st guardedUpdate) bool {
	u, isDoc := field(st.stmt, "u").(bson.D)
	if !isDoc || len(u) == 0 || u[0].Key != "_id" {
		return false
	}
	t, b, err := bson.MarshalValue(u[0].Value)
	return err == nil && t == st.id.Type && bytes.Equal(b, st.id.Value)
}

// field is the value of key in d, nil when d has none.
func field(d bson.D, key string) any {
	for _, e := range d {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}

// maxRun bounds the statements of a run, and so the parameters of its
// query (SQLite allows 32,766).
const maxRun = 1000

// maxUpdate bounds the statements of an update sent to FerretDB. FerretDB
// 1.24 keeps each statement's query open until the command ends
// (msg_update.go), each holding a connection of its SQLite pool of 100,
// and takes one more for each write: an update of about 100 statements
// waited for ever for a connection it held itself, and the whole store
// with it (3 of 20 runs of BenchmarkSteadyLoad; docs/embedded-store.md,
// "Differences that remain"). Updates of 32 leave two thirds of the pool
// to the reads.
const maxUpdate = 32

// idText is a string _id as FerretDB keys its documents: its JSON text.
func idText(id bson.RawValue) string {
	b, _ := json.Marshal(id.StringValue())
	return string(b)
}

// storedGuards reads, for the documents stmts name, the top-level fields
// their guards compare, in one query on the funnel's _id index of coll's
// table, and returns them by idText as BSON documents of those fields:
// strings and numbers as stored, any other kind as null (which no guard
// holds for, as a find's document would not). A document absent from
// the map does not exist.
func storedGuards(h *sql.DB, coll string, stmts []guardedUpdate) (map[string]bson.Raw, error) {
	out := map[string]bson.Raw{}
	if h == nil {
		return out, nil // FerretDB has no file for the database yet
	}
	table, _, err := tableOf(h, coll)
	if err != nil || table == "" {
		return out, err
	}
	var fields []string
	var ids []any
	for _, st := range stmts {
		elems, _ := st.guard.Elements()
		for _, e := range elems {
			if !slices.Contains(fields, e.Key()) {
				fields = append(fields, e.Key())
			}
		}
		ids = append(ids, idText(st.id))
	}
	cols := idJSON
	for _, f := range fields { // fieldName's (guardOf)
		cols += fmt.Sprintf(`, _ferretdb_sjson->'$.%s', _ferretdb_sjson->>'$."$s".p.%s.t'`, f, f)
	}
	q := fmt.Sprintf(`SELECT %s FROM %q WHERE %s IN (?%s) AND %s = 'string'`, cols, table, idJSON, strings.Repeat(", ?", len(ids)-1), idType)
	rows, err := h.Query(q, ids...)
	if err != nil {
		return nil, fmt.Errorf("read the guards of %s: %w", coll, err)
	}
	defer rows.Close()
	vals := make([]sql.NullString, 1+2*len(fields))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("read the guards of %s: %w", coll, err)
		}
		doc := bsoncore.NewDocumentBuilder()
		for i, f := range fields {
			appendStored(doc, f, vals[1+2*i], vals[2+2*i].String)
		}
		out[vals[0].String] = bson.Raw(doc.Build())
	}
	return out, rows.Err()
}

// appendStored appends field f to doc from its JSON text in FerretDB's
// document and its kind in the document's schema ("string", "int",
// "long", "double", ...); nothing when the document has no such field.
func appendStored(doc *bsoncore.DocumentBuilder, f string, text sql.NullString, kind string) {
	if !text.Valid {
		return
	}
	var s string
	i, intErr := strconv.ParseInt(text.String, 10, 64)
	d, floatErr := strconv.ParseFloat(text.String, 64)
	switch {
	case kind == "string" && json.Unmarshal([]byte(text.String), &s) == nil:
		doc.AppendString(f, s)
	case kind == "int" && intErr == nil:
		doc.AppendInt32(f, int32(i))
	case kind == "long" && intErr == nil:
		doc.AppendInt64(f, i)
	case kind == "double" && floatErr == nil:
		doc.AppendDouble(f, d)
	default:
		doc.AppendNull(f)
	}
}
