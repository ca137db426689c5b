package embedded

import (
	"cmp"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Finds the funnel serves from SQLite, which FerretDB 1.24 would answer
// by decoding the whole collection in Go: the log's pages (logpage.go)
// and the read models' finds in _id order, find {filter: {f: s[, g: t][,
// _id: range over strings]}, sort: {_id: 1}[, limit: n][, projection: P]}
// (docs/embedded-store.md, "Finds in _id order"), their candidates from
// FerretDB's index of an equality's field, or, for an _id range alone, the
// table's rows (a rollup's few years, or every summary). SQLite sorts the candidates by the _id string (->>), as MongoDB compares
// strings: the indexes hold JSON text, which escapes some characters and
// sorts a space before the closing quote. Each document is read back by
// _id and checked against the filter in Go. Any find the funnel cannot
// answer as MongoDB would goes to FerretDB.

const (
	idExpr = `_ferretdb_sjson->>'$._id'`
	idType = `_ferretdb_sjson->>'$."$s".p._id.t'`
	// idJSON is the expression of the funnel's _id index (idIndex)
	// and of FerretDB's own look-ups by _id: the _id's JSON text.
	idJSON = `_ferretdb_sjson->'$._id'`
	// maxPage bounds the documents of a find the funnel serves, so that
	// its answer fits one reply.
	maxPage = 2048
)

// fieldName is a top-level field a served find may name: nothing that
// needs quoting in a JSON path or an SQL string.
var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// findFields are the fields a served find may carry: its own and what the
// driver adds to every command.
var findFields = map[string]bool{"find": true, "filter": true, "sort": true, "limit": true, "projection": true, "batchSize": true,
	"singleBatch": true, "lsid": true, "$db": true, "$clusterTime": true, "readConcern": true, "$readPreference": true, "maxTimeMS": true}

// sqlFind is a find the funnel serves: its query selects _id and sorts
// (whether the row's _id, and the sort's field, sort as on MongoDB) where
// the conditions hold, sorted by order.
type sqlFind struct {
	query, where, sorts, order string
	args                       []any        // where's, then the LIMIT
	limit                      int64        // the find's; 0 for none
	equal                      []fieldValue // top-level equalities, checked again on each document read back
	projection                 []string     // included fields; nil without a projection
}

// and adds a condition and its arguments.
func (q *sqlFind) and(cond string, args ...any) {
	q.where, q.args = q.where+" AND "+cond, append(q.args, args...)
}

type fieldValue struct{ field, value string }

// planFind returns the query of a find (body) of collection coll in h;
// ok is false when the funnel leaves it to FerretDB.
func planFind(h *sql.DB, coll string, body bson.Raw) (q sqlFind, ok bool, err error) {
	elems, err := body.Elements()
	if err != nil {
		return q, false, nil
	}
	for _, e := range elems {
		if !findFields[e.Key()] {
			return q, false, nil
		}
	}
	var limit int64
	if v := body.Lookup("limit"); v.Type != 0 {
		if limit, ok = v.AsInt64OK(); !ok || limit < 0 || limit > maxPage {
			return q, false, nil
		}
	}
	var projection []string
	if p := body.Lookup("projection"); p.Type != 0 {
		if projection, ok = inclusion(p); !ok {
			return q, false, nil
		}
	}
	sort, _ := body.Lookup("sort").DocumentOK()
	filter, _ := body.Lookup("filter").DocumentOK()
	conds, err := filter.Elements()
	if err != nil {
		return q, false, nil
	}
	table, settings, err := tableOf(h, coll)
	if err != nil || table == "" {
		return q, false, err
	}
	ok = false
	if coll == LogCollection {
		q, ok = logPage(sort, conds)
	}
	if !ok {
		q, ok, err = idOrder(h, table, settings, sort, conds)
	}
	q.query = fmt.Sprintf(`SELECT %s, %s FROM %q WHERE true%s ORDER BY %s LIMIT ?`, idExpr, q.sorts, table, q.where, q.order)
	q.limit, q.projection = limit, projection
	q.args = append(q.args, cmp.Or(limit, maxPage+1)) // none: served while it fits one reply
	return q, ok, err
}

// idOrder is the query of a find in _id order in table; ok is false when
// it is no such find, or no index serves it.
func idOrder(h *sql.DB, table, settings string, sort bson.Raw, conds []bson.RawElement) (q sqlFind, ok bool, err error) {
	if !sortedBy(sort, 1, "_id") {
		return q, false, nil
	}
	var lower, upper bool
	for _, c := range conds {
		if c.Key() != "_id" {
			v, isString := c.Value().StringValueOK()
			if !isString || !fieldName.MatchString(c.Key()) {
				return q, false, nil
			}
			q.equal = append(q.equal, fieldValue{c.Key(), v})
			continue
		}
		d, _ := c.Value().DocumentOK()
		ops, err := d.Elements()
		if err != nil || len(ops) == 0 || lower || upper {
			return q, false, nil
		}
		for _, op := range ops {
			v, isString := op.Value().StringValueOK()
			sqlOp := map[string]string{"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[op.Key()]
			bound := &lower
			if strings.HasPrefix(sqlOp, "<") {
				bound = &upper
			}
			if sqlOp == "" || !isString || *bound {
				return q, false, nil
			}
			*bound = true
			q.and(idExpr+" "+sqlOp+" ?", v)
		}
		q.and(idType + ` = 'string'`)
	}
	field := ""
	if len(q.equal) > 0 {
		var s struct {
			Indexes []struct{ Key []struct{ Field string } } // FerretDB's metadata.IndexInfo
		}
		if err := json.Unmarshal([]byte(settings), &s); err != nil {
			return q, false, fmt.Errorf("settings of %s: %w", table, err)
		}
		for _, e := range q.equal {
			for _, ix := range s.Indexes {
				if field == "" && len(ix.Key) > 0 && ix.Key[0].Field == e.field {
					field = e.field
				}
			}
		}
		if field == "" {
			return q, false, nil
		}
		var arrays bool
		err := h.QueryRow(fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %q WHERE %s >= '[' AND %[2]s < '\')`, table, ferretExpr(field))).Scan(&arrays)
		if err != nil || arrays {
			return q, false, err
		}
	}
	for _, e := range q.equal {
		value, _ := json.Marshal(e.value) // as FerretDB stores it (sjson): encoding/json's text
		if e.field == field {
			q.and(ferretExpr(e.field)+" = ?", string(value))
		} else {
			q.and(fmt.Sprintf(`(%s = ? OR substr(%[1]s, 1, 1) = '[')`, ferretExpr(e.field)), string(value))
		}
	}
	// An _id of another type sorts first, and makes the find FerretDB's.
	q.sorts, q.order = idType+` IS 'string'`, "2, 1"
	return q, true, nil
}

// ferretExpr is FerretDB's expression of top-level field f in its indexes
// (metadata.Registry.indexesCreate): the field's JSON text.
func ferretExpr(f string) string { return fmt.Sprintf(`_ferretdb_sjson->%q`, f) }

// sortedBy reports whether sort is exactly fields, each in direction dir.
func sortedBy(sort bson.Raw, dir int64, fields ...string) bool {
	keys, err := sort.Elements()
	if err != nil || len(keys) != len(fields) {
		return false
	}
	for i, k := range keys {
		if d, ok := k.Value().AsInt64OK(); !ok || d != dir || k.Key() != fields[i] {
			return false
		}
	}
	return true
}

// inclusion returns the fields of a projection that includes top-level
// fields only ({f: 1, ...}, _id included or not named).
func inclusion(v bson.RawValue) ([]string, bool) {
	p, _ := v.DocumentOK()
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

// serveFind serves a find of planFind's on c, reading the documents back
// on up (the client's own upstream connection); served is false for any
// other command, and for a find the funnel cannot answer as MongoDB would
// or in one reply (FerretDB answers it). An error is up's.
func (f *funnel) serveFind(up, c net.Conn, req []byte, cmd command) (served bool, err error) {
	if cmd.name != "find" {
		return false, nil
	}
	h, err := f.index.handle(cmd.db)
	if err != nil || h == nil {
		return false, nil
	}
	refuse := func(err error) (bool, error) {
		return true, answer(c, req, cmd, refusal(1, "InternalError", "find: "+err.Error()))
	}
	q, ok, err := planFind(h, cmd.collection, cmd.msg.body())
	if err != nil {
		return refuse(err)
	}
	if !ok {
		return false, nil
	}
	ids, ok, err := candidates(h, q)
	if err != nil {
		return refuse(err)
	}
	if !ok || len(ids) > maxPage {
		return false, nil
	}
	docs, size := bson.A{}, 0
	for _, id := range ids {
		if q.limit > 0 && int64(len(docs)) == q.limit {
			break
		}
		doc, err := readBack(up, cmd.db, cmd.collection, id)
		if err != nil {
			return true, err
		}
		if doc == nil || !matches(doc, q.equal) { // gone, or changed since
			continue
		}
		doc = projected(doc, q.projection)
		if size += len(doc); size > maxBatchBytes {
			return false, nil // FerretDB answers it with a cursor
		}
		docs = append(docs, doc)
	}
	if int64(len(docs)) < q.limit && int64(len(ids)) == q.limit {
		return false, nil // candidates failed, and the next ones were not read
	}
	return true, answer(c, req, cmd, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: docs},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: cmd.db + "." + cmd.collection}}}, {Key: "ok", Value: 1.0}})
}

// candidates runs q's query and returns the _ids it selects; ok is false
// when one does not sort as on MongoDB.
func candidates(h *sql.DB, q sqlFind) (ids []string, ok bool, err error) {
	rows, err := h.Query(q.query, q.args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var id sql.NullString
		var sorts bool
		if err := rows.Scan(&id, &sorts); err != nil || !sorts {
			return nil, false, err
		}
		ids = append(ids, id.String)
	}
	return ids, true, rows.Err()
}

// matches reports whether doc meets the equalities as MongoDB's filter
// does: the field is the string, or an array holding it.
func matches(doc bson.Raw, equal []fieldValue) bool {
	for _, e := range equal {
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

// projected returns doc with its _id and the top-level fields named in
// fields alone, in the document's order, as FerretDB answers an inclusion
// projection; doc itself for nil fields (no projection).
func projected(doc bson.Raw, fields []string) bson.Raw {
	if fields == nil {
		return doc
	}
	elems, _ := doc.Elements()
	kept := make([][]byte, 0, len(elems))
	for _, e := range elems {
		if e.Key() == "_id" || slices.Contains(fields, e.Key()) {
			kept = append(kept, e)
		}
	}
	return bson.Raw(bsoncore.BuildDocumentFromElements(nil, kept...))
}
