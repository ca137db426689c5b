package embedded

import (
	"bytes"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/FerretDB/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
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
	guard  []condition // the other top-level conditions of q
	upsert bool
}

// condition is one comparison of a guard: field, operator ("$eq" or
// "$lt") and operand (an int64 or a string), as judged passes them to
// SQLite.
type condition [3]any

// guardedUpdates returns the statements of an update request when every one
// can be served by the funnel (guardOf), and whether the command is
// ordered. ok is false otherwise, and for a request of at most maxUpdate
// statements with no guard at all (FerretDB serves {_id: v} at index speed
// already). Statements in the body rather than in a document sequence, as
// the driver sends them, leave the update to FerretDB.
func guardedUpdates(m *opMsg) (stmts []guardedUpdate, ordered bool, ok bool) {
	guarded := false
	for _, r := range m.seqs["updates"] {
		g, ok := guardOf(r)
		if !ok {
			return nil, false, false
		}
		guarded = guarded || len(g.guard) > 0
		stmts = append(stmts, g)
	}
	ordered, isBool := m.body().Lookup("ordered").BooleanOK()
	return stmts, ordered || !isBool, guarded || len(stmts) > maxUpdate
}

// guardOf splits one update statement into its _id and its guard. It
// refuses (ok false) multi updates, a q without a string _id,
// conditions that are not equalities or operator documents of $eq and $lt
// (what the service sends: a read model's {version: {$lt: v}}, a verify's
// repair on {version: {$eq: v}}, a lease's fence on its owner and epoch)
// on integers and strings, a field whose name is no plain identifier
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
	for _, e := range elems {
		k, v := e.Key(), e.Value()
		ops, isOps := v.DocumentOK()
		opElems, _ := ops.Elements()
		switch {
		case k == "_id" && v.Type == bson.TypeString:
			g.id = v
		case k == "_id" || !fieldName.MatchString(k): // judged names it in a JSON path
			return g, false
		case !isOps && !g.upsert && operand(v) != nil:
			g.guard = append(g.guard, condition{k, "$eq", operand(v)})
		case len(opElems) > 0:
			for _, op := range opElems {
				if o := operand(op.Value()); o != nil && (op.Key() == "$eq" || op.Key() == "$lt") {
					g.guard = append(g.guard, condition{k, op.Key(), o})
				} else {
					return g, false
				}
			}
		default:
			return g, false
		}
	}
	if g.id.Type == 0 || bson.Unmarshal(stmt, &g.stmt) != nil {
		return g, false
	}
	for i := range g.stmt {
		if g.stmt[i].Key == "q" {
			g.stmt[i].Value = bson.D{{Key: "_id", Value: g.id}}
		}
	}
	return g, true
}

// operand is v as a guard compares it: an int64 for an int32 or an int64,
// a string; nil for any other kind (a double operand, which the service
// does not send, leaves the statement to FerretDB).
func operand(v bson.RawValue) any {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return v.AsInt64()
	case bson.TypeString:
		return v.StringValue()
	}
	return nil
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
// The statements go in runs of distinct _ids, each run's guards judged in
// one indexed query (judged): a statement per command, a find and an
// update, cost 1.6 ms, a run of 32 0.5 ms a statement (docs/embedded-store.md,
// "Guarded updates at index speed"). Only the store itself can then fail a
// statement, and its answer is the command's. An error means up failed.
func serveGuarded(up net.Conn, h *sql.DB, db, coll string, stmts []guardedUpdate, ordered bool) (bson.Raw, error) {
	var n, modified int32
	var upserted, writeErrors bson.A
	for from := 0; from < len(stmts); {
		to, seen, size := from, map[string]bool{}, 0
		for ; to < len(stmts) && !seen[string(stmts[to].id.Value)] && size < maxBatchBytes; to++ {
			seen[string(stmts[to].id.Value)] = true
			size += stmts[to].size
		}
		judgement, err := judged(h, coll, stmts[from:to])
		if err != nil {
			return nil, err
		}
		var send, inserts bson.A
		var inserted, replaced []int // the statements of inserts, of replacements of stored documents
		byID := map[string]int{}     // a sent statement's index by its _id's JSON text
		stop := false
		for i := from; i < to && !stop; i++ {
			st := stmts[i]
			holds, found := judgement[idText(st.id)]
			switch {
			case found && !holds && st.upsert:
				writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(11000)},
					{Key: "errmsg", Value: fmt.Sprintf("E11000 duplicate key error collection: %s.%s index: _id_ dup key: { _id: %s }", db, coll, st.id)}})
				stop = ordered
			case found && !holds, !found && !st.upsert:
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

// judged reads, for the documents stmts name (distinct _ids), whether
// each statement's guard holds, in one query on the funnel's _id index of
// coll's table, by idText; a document absent from the map does not exist.
// SQLite judges a condition as MongoDB does with its default collation:
// a string only against a string, byte by byte; a number (int32, int64
// or double) only against a number, exactly (SQLite compares an integer
// with a real without rounding either); a missing field, or one of any
// other kind, never holds.
func judged(h *sql.DB, coll string, stmts []guardedUpdate) (map[string]bool, error) {
	out := map[string]bool{}
	if h == nil {
		return out, nil // FerretDB has no file for the database yet
	}
	table, _, err := tableOf(h, coll)
	if err != nil || table == "" {
		return out, err
	}
	// [[idText, [[field, operator, operand], ...]], ...]; an empty guard
	// as [], not null, which json_each would walk as one condition.
	guards := make([][2]any, len(stmts))
	for i, st := range stmts {
		guards[i] = [2]any{idText(st.id), append([]condition{}, st.guard...)}
	}
	arg, err := json.Marshal(guards)
	if err != nil {
		return nil, err
	}
	// A stored double is read as a real: its JSON text may have no
	// exponent (2^60 as 1152921504606847000), which SQLite reads as an
	// integer.
	const kind = `t._ferretdb_sjson->>('$."$s".p.' || (c.value->>0) || '.t')`
	const value = `iif(` + kind + ` = 'double', CAST(t._ferretdb_sjson->>('$.' || (c.value->>0)) AS REAL), t._ferretdb_sjson->>('$.' || (c.value->>0)))`
	rows, err := h.Query(fmt.Sprintf(`SELECT g.value->>0, NOT EXISTS (SELECT 1 FROM json_each(g.value, '$[1]') AS c
		WHERE NOT coalesce(iif(typeof(c.value->>2) = 'text', %[2]s = 'string', %[2]s IN ('int', 'long', 'double'))
			AND iif(c.value->>1 = '$eq', %[3]s = c.value->>2, %[3]s < c.value->>2), false))
		FROM json_each(?) AS g JOIN %[1]q AS t ON t.%[4]s = g.value->>0 WHERE t.%[5]s = 'string'`, table, kind, value, idJSON, idType), string(arg))
	if err != nil {
		return nil, fmt.Errorf("judge the guards of %s: %w", coll, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var holds bool
		if err := rows.Scan(&id, &holds); err != nil {
			return nil, fmt.Errorf("judge the guards of %s: %w", coll, err)
		}
		out[id] = holds
	}
	return out, rows.Err()
}
