package embedded

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/FerretDB/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Guarded updates. FerretDB 1.24 hands SQLite only a filter that is
// exactly {_id: v} (internal/backends/sqlite/collection.go, Filter.Len()
// == 1); {_id: v, version: {$lt: 7}} is evaluated in Go over the whole
// collection (docs/embedded-store.md, "Guarded updates at index speed").
// It also stops an update of several statements at the first error,
// reports no writeErrors, and numbers upserts by their count instead of
// their statement. The funnel runs every write alone on one connection,
// so it serves such an update itself, with MongoDB's answers: per
// statement it reads the document by _id (indexed), evaluates the guard
// in Go, and sends the statement with the filter {_id: v} only when the
// guard holds. A statement whose guard fails is, as on MongoDB, matched by
// nothing, and with upsert a duplicate key on _id (the insert the upsert
// would make). Statements it cannot judge (see guardOf) make it pass the
// whole command to FerretDB unchanged.

// guardedUpdate is one statement of an update command the funnel serves.
type guardedUpdate struct {
	stmt  bson.D // the statement with q reduced to {_id: id}
	id    bson.RawValue
	guard bson.Raw // the other top-level conditions of q
}

// guardedUpdates returns the statements of an update request when every one
// can be served by the funnel: q holds _id equal to a string or ObjectID
// plus conditions guardOf understands, and multi is not set. ok is false
// otherwise, and for a request with no guard at all (FerretDB serves
// {_id: v} at index speed already).
func guardedUpdates(m *opMsg) (body bson.Raw, stmts []guardedUpdate, ordered bool, ok bool) {
	if m == nil {
		return nil, nil, false, false
	}
	// The driver sends the statements as a document sequence; an update
	// with them in its body goes to FerretDB as it is.
	var raws []bson.Raw
	for _, s := range m.sections {
		if s.identifier == "updates" {
			raws = append(raws, s.docs...)
		}
	}
	body = m.body()
	if body == nil || len(raws) == 0 {
		return nil, nil, false, false
	}
	ordered = true
	if v, err := body.LookupErr("ordered"); err == nil {
		ordered, _ = v.BooleanOK()
	}
	guarded := false
	for _, r := range raws {
		g, ok := guardOf(r)
		if !ok {
			return nil, nil, false, false
		}
		guarded = guarded || len(g.guard) > 5
		stmts = append(stmts, g)
	}
	return body, stmts, ordered, guarded
}

// guardOf splits one update statement into its _id and its guard. It
// refuses (ok false) multi updates, a q without a string or ObjectID _id,
// conditions that are not equalities or operator documents of $eq and $lt
// (what the service sends: a read model's {version: {$lt: v}}, a verify's
// repair on {version: {$eq: v}}, a lease's fence on its owner and epoch)
// on numbers and strings, and, with upsert, a plain equality beyond _id
// (an upsert copies it into the document it inserts).
func guardOf(stmt bson.Raw) (guardedUpdate, bool) {
	if m, err := stmt.LookupErr("multi"); err == nil && m.Type == bson.TypeBoolean && m.Boolean() {
		return guardedUpdate{}, false
	}
	q, ok := stmt.Lookup("q").DocumentOK()
	if !ok {
		return guardedUpdate{}, false
	}
	upsert, _ := stmt.Lookup("upsert").BooleanOK()
	elems, err := q.Elements()
	if err != nil {
		return guardedUpdate{}, false
	}
	var g guardedUpdate
	guard := bson.D{}
	for _, e := range elems {
		k, v := e.Key(), e.Value()
		if k == "_id" {
			if v.Type != bson.TypeString && v.Type != bson.TypeObjectID {
				return guardedUpdate{}, false
			}
			g.id = v
			continue
		}
		if strings.HasPrefix(k, "$") || strings.Contains(k, ".") {
			return guardedUpdate{}, false
		}
		ops, isDoc := v.DocumentOK()
		if !isDoc {
			if upsert || !scalar(v) {
				return guardedUpdate{}, false // see the doc comment
			}
			guard = append(guard, bson.E{Key: k, Value: bson.D{{Key: "$eq", Value: v}}})
			continue
		}
		opElems, err := ops.Elements()
		if err != nil || len(opElems) == 0 {
			return guardedUpdate{}, false
		}
		for _, op := range opElems {
			if _, known := comparisons[op.Key()]; !known || !scalar(op.Value()) {
				return guardedUpdate{}, false
			}
		}
		guard = append(guard, bson.E{Key: k, Value: v})
	}
	if g.id.Type == 0 {
		return guardedUpdate{}, false
	}
	var err2 error
	if g.guard, err2 = bson.Marshal(guard); err2 != nil {
		return guardedUpdate{}, false
	}
	var stmtD bson.D
	if err := bson.Unmarshal(stmt, &stmtD); err != nil {
		return guardedUpdate{}, false
	}
	for i := range stmtD {
		if stmtD[i].Key == "q" {
			stmtD[i].Value = bson.D{{Key: "_id", Value: g.id}}
		}
	}
	g.stmt = stmtD
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
	var out bson.Raw
	if m := parseOpMsg(resp); m != nil {
		out = m.body()
	}
	if out == nil {
		return nil, errors.New("store reply without a body")
	}
	return out, nil
}

// serveGuarded runs the statements of an update command (body, from
// guardedUpdates) on up, which the caller holds alone, and returns
// MongoDB's reply: n, nModified, upserted with statement indexes, and
// writeErrors (a failed guard under upsert is E11000 on _id). An ordered
// command stops at its first write error. An error means up failed
// (the outcome of the statement in flight is unknown).
func serveGuarded(up net.Conn, body bson.Raw, stmts []guardedUpdate, ordered bool) (bson.Raw, error) {
	db, _ := body.Lookup("$db").StringValueOK()
	coll, _ := body.Lookup("update").StringValueOK()
	var (
		n, modified int32
		upserted    bson.A
		writeErrors bson.A
	)
	for i, st := range stmts {
		found, err := roundTrip(up, bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: st.id}}},
			{Key: "limit", Value: int32(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: db}})
		if err != nil {
			return nil, err
		}
		if ok, _ := found.Lookup("ok").AsFloat64OK(); ok != 1 {
			return found, nil // the store refused the read: its answer is the command's
		}
		var doc bson.Raw
		if docs := firstBatch(found); len(docs) > 0 {
			doc = docs[0]
		}
		upsert := false
		for _, e := range st.stmt {
			if e.Key == "upsert" {
				upsert, _ = e.Value.(bool)
			}
		}
		if doc != nil && !holds(doc, st.guard) {
			if upsert {
				writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(11000)},
					{Key: "errmsg", Value: fmt.Sprintf("E11000 duplicate key error collection: %s.%s index: _id_ dup key: { _id: %s }", db, coll, st.id)}})
				if ordered {
					break
				}
			}
			continue
		}
		reply, err := roundTrip(up, bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: bson.A{st.stmt}},
			{Key: "ordered", Value: true}, {Key: "$db", Value: db}})
		if err != nil {
			return nil, err
		}
		if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
			code, _ := reply.Lookup("code").AsInt64OK()
			msg, _ := reply.Lookup("errmsg").StringValueOK()
			writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(code)}, {Key: "errmsg", Value: msg}})
			if ordered {
				break
			}
			continue
		}
		if errs, isArr := reply.Lookup("writeErrors").ArrayOK(); isArr {
			vals, _ := errs.Values()
			for _, v := range vals {
				we, _ := v.DocumentOK()
				code, _ := we.Lookup("code").AsInt64OK()
				msg, _ := we.Lookup("errmsg").StringValueOK()
				writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(code)}, {Key: "errmsg", Value: msg}})
			}
			if len(vals) > 0 {
				if ordered {
					break
				}
				continue
			}
		}
		if ups, isArr := reply.Lookup("upserted").ArrayOK(); isArr {
			if vals, _ := ups.Values(); len(vals) > 0 {
				upserted = append(upserted, bson.D{{Key: "index", Value: int32(i)}, {Key: "_id", Value: st.id}})
				n++
				continue
			}
		}
		m, _ := reply.Lookup("n").AsInt64OK()
		nm, _ := reply.Lookup("nModified").AsInt64OK()
		n += int32(m)
		modified += int32(nm)
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
