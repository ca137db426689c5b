package embedded

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Finds in _id order through an index. The service reads its read models
// with find {filter: F, sort: {_id: 1}[, limit: n][, projection: P]}, where F
// holds equalities of top-level fields to strings (a customer's summaries:
// {customer_id: c[, status: s]}) and at most one range of _id over strings
// (the next page's {_id: {$gt: after}}, a rollup's {_id: {$gte: a, $lte:
// b}}); on MongoDB the index that starts with the equality's field, or the
// _id index, serves it. FerretDB 1.24 hands SQLite only a filter that is
// exactly {_id: v} and decodes the whole collection in Go for any other,
// so the funnel serves exactly these finds from SQLite
// (docs/embedded-store.md, "Finds in _id order"):
//
//   - the candidates come from an index: FerretDB's own index whose key
//     starts with an equality's field (its expression is the JSON text of
//     the field, _ferretdb_sjson->"f", so the candidates are the documents
//     whose field is that string), or, with no equality, the funnel's _id
//     index (index.go) over the strings sharing the range's bounds' prefix;
//   - SQLite sorts the candidates by the _id string itself (->>), as
//     MongoDB compares strings, byte by byte of UTF-8. The indexes hold JSON
//     text, whose order is not that: JSON escapes '"', '\', '<', '>', '&'
//     and control characters, and a space sorts before the closing quote.
//     The sort costs what the candidates number (a customer's orders), not
//     the collection;
//   - each document is read back by _id on the client's own upstream
//     connection (an index look-up) with the find's projection and the
//     filter's fields, checked against the whole filter in Go (a document
//     changed since its candidate was read, or holding an array of
//     strings, answers as on MongoDB) and answered without the fields the
//     projection left out.
//
// Any other find goes to FerretDB: another sort or operator, a limit above
// maxPage (or none, and more than maxPage candidates), a projection that
// is not an inclusion of top-level fields, an equality on a field no
// ascending index starts with, a collection where a document holds an
// array in that field (MongoDB's equality matches an array's elements,
// which the index does not hold), and a find without an _id range whose
// candidates have an _id that is no string (MongoDB sorts such _ids apart
// from strings).

const (
	idType = `_ferretdb_sjson->>'$."$s".p._id.t'`
	// idJSON is the expression of the funnel's _id index (createIDIndex)
	// and of FerretDB's own look-ups by _id: the _id's JSON text.
	idJSON = `_ferretdb_sjson->'$._id'`
)

// fieldName is a top-level field a served find may name: nothing that
// needs quoting in a JSON path or an SQL string.
var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// indexFind is a find the funnel serves in _id order.
type indexFind struct {
	equal        []fieldValue // in the filter's order
	lower, upper *idBound     // nil when the range has no such end
	limit        int64        // 0 for none
	projection   []string     // included fields; nil without a projection
}

type fieldValue struct{ field, value string }

type idBound struct {
	value string
	op    string // SQL's comparison of the _id to value
}

// rangeOps are the _id range's operators, as SQL compares.
var rangeOps = map[string]string{"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}

// parseIndexFind returns the find body asks for; ok is false for any
// find the funnel leaves to FerretDB by its shape alone.
func parseIndexFind(body bson.Raw) (q indexFind, ok bool) {
	elems, err := body.Elements()
	if err != nil {
		return q, false
	}
	for _, e := range elems {
		if !pageFields[e.Key()] && e.Key() != "projection" {
			return q, false
		}
	}
	sort, _ := body.Lookup("sort").DocumentOK()
	if keys, err := sort.Elements(); err != nil || len(keys) != 1 || keys[0].Key() != "_id" {
		return q, false
	} else if dir, ok := keys[0].Value().AsInt64OK(); !ok || dir != 1 {
		return q, false
	}
	if v := body.Lookup("limit"); v.Type != 0 {
		if q.limit, ok = v.AsInt64OK(); !ok || q.limit < 0 || q.limit > maxPage {
			return q, false
		}
	}
	filter, _ := body.Lookup("filter").DocumentOK()
	conds, err := filter.Elements()
	if err != nil {
		return q, false
	}
	for _, c := range conds {
		if c.Key() == "_id" {
			if q.lower != nil || q.upper != nil || !q.parseRange(c.Value()) {
				return q, false
			}
			continue
		}
		v, ok := c.Value().StringValueOK()
		if !ok || !fieldName.MatchString(c.Key()) {
			return q, false
		}
		q.equal = append(q.equal, fieldValue{c.Key(), v})
	}
	if p, has := body.Lookup("projection").DocumentOK(); has {
		if q.projection, ok = inclusion(p); !ok {
			return q, false
		}
	} else if body.Lookup("projection").Type != 0 {
		return q, false
	}
	return q, true
}

// parseRange reads {$gt|$gte: a, $lt|$lte: b} of strings, either end
// optional but not both.
func (q *indexFind) parseRange(v bson.RawValue) bool {
	ops, _ := v.DocumentOK()
	elems, err := ops.Elements()
	if err != nil || len(elems) == 0 {
		return false
	}
	for _, e := range elems {
		s, ok := e.Value().StringValueOK()
		if !ok {
			return false
		}
		b := &idBound{value: s, op: rangeOps[e.Key()]}
		switch e.Key() {
		case "$gt", "$gte":
			if q.lower != nil {
				return false
			}
			q.lower = b
		case "$lt", "$lte":
			if q.upper != nil {
				return false
			}
			q.upper = b
		default:
			return false
		}
	}
	return true
}

// inclusion returns the fields of a projection that includes top-level
// fields only ({f: 1, ...}, _id included or not named).
func inclusion(p bson.Raw) ([]string, bool) {
	elems, err := p.Elements()
	if err != nil || len(elems) == 0 {
		return nil, false
	}
	var fields []string
	for _, e := range elems {
		on, isBool := e.Value().BooleanOK()
		n, isNum := e.Value().AsInt64OK()
		if !(isBool && on || isNum && n == 1) || !fieldName.MatchString(e.Key()) {
			return nil, false
		}
		fields = append(fields, e.Key())
	}
	return fields, true
}

// serveIndexFind serves a find in _id order on c, reading the documents
// back on up (the client's own upstream connection); served is false for
// any other command, and for a find the funnel cannot answer as MongoDB
// would or in one reply (FerretDB answers it). An error is up's.
func (f *funnel) serveIndexFind(up, c net.Conn, req []byte, cmd command) (served bool, err error) {
	if cmd.name != "find" {
		return false, nil
	}
	q, ok := parseIndexFind(cmd.msg.body())
	if !ok {
		return false, nil
	}
	h, err := f.streams.handle(cmd.db)
	if err != nil || h == nil {
		return false, nil
	}
	refuse := func(err error) (bool, error) {
		return true, answer(c, req, cmd, refusal(1, "InternalError", "find: "+err.Error()))
	}
	plan, ok, err := planIndexFind(h, cmd.collection, q)
	if err != nil {
		return refuse(err)
	}
	if !ok {
		return false, nil
	}
	limit := q.limit
	if limit == 0 { // served while it fits one reply
		limit = maxPage + 1
	}
	ids, ok, err := plan.ids(h, "", limit)
	if err != nil {
		return refuse(err)
	}
	if !ok || int64(len(ids)) > maxPage {
		return false, nil
	}
	fields, added := q.readFields()
	docs, size := bson.A{}, 0
	for asked := limit; ; {
		for _, id := range ids {
			doc, err := readBack(up, cmd.db, cmd.collection, id, fields)
			if err != nil {
				return true, err
			}
			if doc == nil || !q.matches(doc) { // gone, or changed since
				continue
			}
			if size += len(doc); size > maxBatchBytes {
				return false, nil // FerretDB answers it with a cursor
			}
			if docs = append(docs, without(doc, added)); int64(len(docs)) == limit {
				break
			}
		}
		if int64(len(docs)) == limit || int64(len(ids)) < asked {
			break // the page is full, or there are no more candidates
		}
		asked = limit - int64(len(docs))
		if ids, _, err = plan.ids(h, ids[len(ids)-1], asked); err != nil {
			return refuse(err)
		}
	}
	return true, answer(c, req, cmd, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: docs},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: cmd.db + "." + cmd.collection}}}, {Key: "ok", Value: 1.0}})
}

// readFields is the projection a served find reads its documents back
// with, and the fields it adds to q's own so that the filter can be
// checked; nil, nil for whole documents.
func (q indexFind) readFields() (fields bson.D, added map[string]bool) {
	if q.projection == nil {
		return nil, nil
	}
	added = map[string]bool{}
	for _, p := range q.projection {
		fields = append(fields, bson.E{Key: p, Value: 1})
	}
	for _, e := range q.equal {
		if !slices.Contains(q.projection, e.field) && !added[e.field] {
			fields, added[e.field] = append(fields, bson.E{Key: e.field, Value: 1}), true
		}
	}
	return fields, added
}

// matches reports whether doc meets q's equalities as MongoDB's filter
// does: the field is the string, or an array holding it.
func (q indexFind) matches(doc bson.Raw) bool {
	for _, e := range q.equal {
		v := doc.Lookup(e.field)
		if s, ok := v.StringValueOK(); ok && s == e.value {
			continue
		}
		arr, _ := v.ArrayOK()
		vals, _ := arr.Values()
		if !slices.ContainsFunc(vals, func(x bson.RawValue) bool { s, ok := x.StringValueOK(); return ok && s == e.value }) {
			return false
		}
	}
	return true
}

// without returns doc without the top-level fields named in drop.
func without(doc bson.Raw, drop map[string]bool) bson.Raw {
	if len(drop) == 0 {
		return doc
	}
	elems, _ := doc.Elements()
	kept := make([][]byte, 0, len(elems))
	for _, e := range elems {
		if !drop[e.Key()] {
			kept = append(kept, e)
		}
	}
	return bson.Raw(bsoncore.BuildDocumentFromElements(nil, kept...))
}

// indexPlan is how a served find reads its candidates' _ids: the
// collection's table and, when the find has an equality, the field of
// the FerretDB index it searches.
type indexPlan struct {
	table  string
	field  string // "" for the _id index
	idJSON string // the _id's expression in that index, for the range's prefix
	q      indexFind
}

// ferretIndex is an index as FerretDB records it in the settings of a
// collection (metadata.IndexInfo).
type ferretIndex struct {
	Key []struct {
		Field      string `json:"field"`
		Descending bool   `json:"descending"`
	} `json:"key"`
}

// planIndexFind returns the plan of q on collection coll; ok is false when
// the funnel leaves q to FerretDB: no such collection, no index for its
// equalities, or a document holding an array in the indexed field.
func planIndexFind(h *sql.DB, coll string, q indexFind) (p indexPlan, ok bool, err error) {
	var settings string
	err = h.QueryRow(`SELECT table_name, settings FROM _ferretdb_collections WHERE name = ?`, coll).Scan(&p.table, &settings)
	if errors.Is(err, sql.ErrNoRows) || isNoSuchTable(err) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	p.q, p.idJSON = q, idJSON
	if len(q.equal) == 0 {
		return p, true, nil
	}
	var s struct {
		Indexes []ferretIndex `json:"indexes"`
	}
	if err := json.Unmarshal([]byte(settings), &s); err != nil {
		return p, false, fmt.Errorf("settings of %s: %w", coll, err)
	}
	for _, e := range q.equal {
		for _, ix := range s.Indexes {
			if len(ix.Key) == 0 || ix.Key[0].Field != e.field || ix.Key[0].Descending {
				continue
			}
			p.field = e.field
			if len(ix.Key) > 1 && ix.Key[1].Field == "_id" && !ix.Key[1].Descending {
				p.idJSON = ferretExpr("_id")
			}
			break
		}
		if p.field != "" {
			break
		}
	}
	if p.field == "" {
		return p, false, nil
	}
	var arrays int
	err = h.QueryRow(fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %q WHERE %s >= '[' AND %[2]s < '\' LIMIT 1)`,
		p.table, ferretExpr(p.field))).Scan(&arrays)
	return p, err == nil && arrays == 0, err
}

// ferretExpr is FerretDB's expression of top-level field f in its indexes
// (metadata.Registry.indexesCreate): the field's JSON text.
func ferretExpr(f string) string { return fmt.Sprintf(`_ferretdb_sjson->%q`, f) }

// ids returns up to limit candidates' _ids after the _id after ("" for
// the first), in order; ok is false when a candidate's _id is no string
// and the find has no _id range.
func (p indexPlan) ids(h *sql.DB, after string, limit int64) (ids []string, ok bool, err error) {
	query, args := p.sql(after, limit)
	rows, err := h.QueryContext(context.Background(), query, args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, typ sql.NullString
		if err := rows.Scan(&id, &typ); err != nil {
			return nil, false, err
		}
		if typ.String != "string" {
			return nil, false, nil
		}
		ids = append(ids, id.String)
	}
	return ids, true, rows.Err()
}

// sql is the query of the candidates' _ids and their types, and its
// arguments.
func (p indexPlan) sql(after string, limit int64) (string, []any) {
	var where []string
	var args []any
	and := func(cond string, a ...any) { where, args = append(where, cond), append(args, a...) }
	for _, e := range p.q.equal {
		value, _ := json.Marshal(e.value) // as FerretDB stores it (sjson): encoding/json's text
		if e.field == p.field {
			and(ferretExpr(e.field)+" = ?", string(value))
			continue
		}
		expr := fmt.Sprintf(`_ferretdb_sjson->'$.%s'`, e.field)
		and(fmt.Sprintf(`(%s = ? OR substr(%[1]s, 1, 1) = '[')`, expr), string(value))
	}
	ranged := p.q.lower != nil || p.q.upper != nil || after != ""
	if ranged {
		from, to := jsonPrefixRange(p.q.lower, p.q.upper)
		and(fmt.Sprintf(`%s >= ? AND %[1]s < ?`, p.idJSON), from, to)
		and(idType + ` = 'string'`)
	}
	for _, b := range []*idBound{p.q.lower, p.q.upper} {
		if b != nil {
			and(idExpr+" "+b.op+" ?", b.value)
		}
	}
	if after != "" {
		and(idExpr+" > ?", after)
	}
	order := idExpr
	if !ranged {
		order = fmt.Sprintf(`coalesce(%s, '') = 'string', %s`, idType, idExpr) // any other type first: the find is then FerretDB's
	}
	cond := "true"
	if len(where) > 0 {
		cond = strings.Join(where, " AND ")
	}
	return fmt.Sprintf(`SELECT %s, %s FROM %q WHERE %s ORDER BY %s LIMIT ?`, idExpr, idType, p.table, cond, order), append(args, limit)
}

// jsonPrefixRange bounds, in the order of the JSON text the _id indexes
// hold, every string between lower and upper: the strings that begin with
// the bounds' common prefix, up to its first character JSON would escape
// or that sorts below '"' (the text of such a string begins with '"' and
// that prefix unchanged). Without both bounds, every string: ['"', '#').
func jsonPrefixRange(lower, upper *idBound) (from, to string) {
	prefix := ""
	if lower != nil && upper != nil {
		a, b := lower.value, upper.value
		for i := 0; i < len(a) && i < len(b) && a[i] == b[i] && plainJSON(a[i]); i++ {
			prefix = a[:i+1]
		}
	}
	if prefix == "" {
		return `"`, `#`
	}
	last := len(prefix) - 1
	return `"` + prefix, `"` + prefix[:last] + string(rune(prefix[last]+1))
}

// plainJSON reports whether encoding/json writes byte c of a string as it
// is, and it sorts above '"': printable ASCII but for '\', '<', '>', '&'.
func plainJSON(c byte) bool {
	return c > '"' && c < 0x7f && !strings.ContainsRune(`\<>&`, rune(c))
}
