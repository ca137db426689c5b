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
// exactly {_id: v}; {_id: v, version: {$lt: 7}} is evaluated in Go over the
// whole collection (docs/embedded-store.md, "Guarded updates at index
// speed"), and an update of several statements stops at its first error
// and numbers upserts by count. The funnel, which runs every write alone,
// serves such an update itself with MongoDB's answers: per statement it
// reads the document by _id, evaluates the guard in Go, and sends the
// statement with the filter {_id: v} only when the guard holds. A failed
// guard matches nothing, and under upsert is a duplicate key on _id.
// Statements it cannot judge (guardOf) leave the command to FerretDB.

// guardedUpdate is one statement of an update command the funnel serves.
type guardedUpdate struct {
	stmt   bson.D // the statement with q reduced to {_id: id}
	id     bson.RawValue
	guard  bson.Raw // the other top-level conditions of q
	upsert bool
}

// guardedUpdates returns the statements of an update request when every one
// can be served by the funnel (guardOf), and whether the command is
// ordered. ok is false otherwise, and for a request with no guard at all
// (FerretDB serves {_id: v} at index speed already). The driver sends the
// statements as a document sequence; an update with them in its body goes
// to FerretDB as it is.
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
	return stmts, ordered || !isBool, guarded
}

// guardOf splits one update statement into its _id and its guard. It
// refuses (ok false) multi updates, a q without a string or ObjectID _id,
// conditions that are not equalities or operator documents of $eq and $lt
// (what the service sends: a read model's {version: {$lt: v}}, a verify's
// repair on {version: {$eq: v}}, a lease's fence on its owner and epoch)
// on numbers and strings, and, with upsert, a plain equality beyond _id
// (an upsert copies it into the document it inserts).
func guardOf(stmt bson.Raw) (g guardedUpdate, ok bool) {
	q, isDoc := stmt.Lookup("q").DocumentOK()
	elems, err := q.Elements()
	if multi, _ := stmt.Lookup("multi").BooleanOK(); multi || !isDoc || err != nil {
		return g, false
	}
	g.upsert, _ = stmt.Lookup("upsert").BooleanOK()
	guard := bson.D{}
	for _, e := range elems {
		k, v := e.Key(), e.Value()
		ops, isOps := v.DocumentOK()
		opElems, _ := ops.Elements()
		switch {
		case k == "_id" && (v.Type == bson.TypeString || v.Type == bson.TypeObjectID):
			g.id = v
		case k == "_id" || strings.HasPrefix(k, "$") || strings.Contains(k, "."):
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
	var out bson.Raw
	if m := parseOpMsg(resp); m != nil {
		out = m.body()
	}
	if out == nil {
		return nil, errors.New("store reply without a body")
	}
	return out, nil
}

// serveGuarded runs the statements of an update command of db.coll (from
// guardedUpdates) on up, which the caller holds alone, and returns
// MongoDB's reply: n, nModified, upserted with statement indexes, and
// writeErrors (a failed guard under upsert is E11000 on _id). An ordered
// command stops at its first write error. An error means up failed
// (the outcome of the statement in flight is unknown).
func serveGuarded(up net.Conn, db, coll string, stmts []guardedUpdate, ordered bool) (bson.Raw, error) {
	var n, modified int32
	var upserted, writeErrors bson.A
	for i, st := range stmts {
		found, err := roundTrip(up, bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: st.id}}},
			{Key: "limit", Value: int32(1)}, {Key: "singleBatch", Value: true}, {Key: "$db", Value: db}})
		if err != nil {
			return nil, err
		}
		if ok, _ := found.Lookup("ok").AsFloat64OK(); ok != 1 {
			return found, nil // the store refused the read: its answer is the command's
		}
		var failed []bson.Raw // the statement's write errors, each with its code and errmsg
		if docs := firstBatch(found); len(docs) > 0 && !holds(docs[0], st.guard) {
			if !st.upsert {
				continue
			}
			dup, _ := bson.Marshal(bson.D{{Key: "code", Value: int32(11000)},
				{Key: "errmsg", Value: fmt.Sprintf("E11000 duplicate key error collection: %s.%s index: _id_ dup key: { _id: %s }", db, coll, st.id)}})
			failed = append(failed, dup)
		} else {
			reply, err := roundTrip(up, bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: bson.A{st.stmt}},
				{Key: "ordered", Value: true}, {Key: "$db", Value: db}})
			if err != nil {
				return nil, err
			}
			if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
				failed = append(failed, reply)
			}
			errs, _ := reply.Lookup("writeErrors").ArrayOK()
			vals, _ := errs.Values()
			for _, v := range vals {
				if we, isDoc := v.DocumentOK(); isDoc {
					failed = append(failed, we)
				}
			}
			ups, _ := reply.Lookup("upserted").ArrayOK()
			switch vals, _ := ups.Values(); {
			case len(failed) > 0:
			case len(vals) > 0:
				upserted = append(upserted, bson.D{{Key: "index", Value: int32(i)}, {Key: "_id", Value: st.id}})
				n++
			default:
				m, _ := reply.Lookup("n").AsInt64OK()
				nm, _ := reply.Lookup("nModified").AsInt64OK()
				n += int32(m)
				modified += int32(nm)
			}
		}
		for _, we := range failed {
			code, _ := we.Lookup("code").AsInt64OK()
			msg, _ := we.Lookup("errmsg").StringValueOK()
			writeErrors = append(writeErrors, bson.D{{Key: "index", Value: int32(i)}, {Key: "code", Value: int32(code)}, {Key: "errmsg", Value: msg}})
		}
		if len(failed) > 0 && ordered {
			break
		}
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
