package embedded

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The log browser's pages. The service pages the event log newest first
// with one query on its (recorded_at, _id) index, here as on MongoDB:
// find events {filter: F, sort: {recorded_at: -1, _id: -1}, limit: n},
// where F is {}, a cursor's bound {$or: [{recorded_at: {$lt: t}},
// {recorded_at: t, _id: {$lt: id}}]}, {"events.correlation_id": c}, or c
// and a bound. FerretDB would decode and sort the whole log in Go
// (docs/embedded-store.md, "The log browser"), so the funnel serves these
// finds from SQLite expression indexes of the log's table (logIndexes):
// the page's _ids from the index, then each document read back by _id.
// The event store keeps a commit's events to one correlation id, so the
// index holds the first event's. A recorded_at that is not a date, or an
// _id that is not a string, would sort otherwise than on MongoDB: the
// page answers an error then. Any other find goes to FerretDB.

// LogCollection is the collection of the event log (the mongodb
// package's CommitsCollection).
const LogCollection = "events"

const (
	recordedExpr    = `_ferretdb_sjson->>'$.recorded_at'`
	idExpr          = `_ferretdb_sjson->>'$._id'`
	correlationExpr = `_ferretdb_sjson->>'$.events[0].correlation_id'`
	// maxPage bounds the limit of a page the funnel serves, so that an
	// answer stays well under MongoDB's 16 MiB reply.
	maxPage = 2048
)

// logIndexes are the SQLite indexes of the log's table that serve its
// pages, by name suffix.
var logIndexes = map[string]string{
	"_recorded_path":    recordedExpr + ", " + idExpr,
	"_correlation_path": correlationExpr + ", " + recordedExpr + ", " + idExpr,
}

// pageQuery is a log page the funnel serves.
type pageQuery struct {
	correlation string // "" for all commits
	bounded     bool   // below (at, id) only
	at          int64  // recorded_at, ms since the epoch
	id          string
	limit       int64
}

// pageFields are the fields a served find may carry besides its filter,
// sort and limit: what the driver adds to every command.
var pageFields = map[string]bool{"find": true, "filter": true, "sort": true, "limit": true, "batchSize": true, "singleBatch": true,
	"lsid": true, "$db": true, "$clusterTime": true, "readConcern": true, "$readPreference": true, "maxTimeMS": true}

// parsePage returns the log page body asks for; ok is false for any other
// find.
func parsePage(body bson.Raw) (q pageQuery, ok bool) {
	elems, err := body.Elements()
	if err != nil {
		return q, false
	}
	for _, e := range elems {
		if !pageFields[e.Key()] {
			return q, false
		}
	}
	sort, _ := body.Lookup("sort").DocumentOK()
	if keys, err := sort.Elements(); err != nil || len(keys) != 2 || keys[0].Key() != "recorded_at" || keys[1].Key() != "_id" ||
		keys[0].Value().AsInt64() != -1 || keys[1].Value().AsInt64() != -1 {
		return q, false
	}
	q.limit, ok = body.Lookup("limit").AsInt64OK()
	if !ok || q.limit <= 0 || q.limit > maxPage {
		return q, false
	}
	filter, _ := body.Lookup("filter").DocumentOK()
	conds, err := filter.Elements()
	if err != nil {
		return q, false
	}
	for _, c := range conds {
		switch v := c.Value(); c.Key() {
		case "events.correlation_id":
			if q.correlation, ok = v.StringValueOK(); !ok || q.correlation == "" {
				return q, false
			}
		case "$or":
			if q.at, q.id, q.bounded = parseBound(v); !q.bounded {
				return q, false
			}
		default:
			return q, false
		}
	}
	return q, true
}

// parseBound reads the cursor's bound {$or: [{recorded_at: {$lt: t}},
// {recorded_at: t, _id: {$lt: id}}]}, as exactly that.
func parseBound(v bson.RawValue) (at int64, id string, ok bool) {
	arr, _ := v.ArrayOK()
	branches, err := arr.Values()
	if err != nil || len(branches) != 2 {
		return 0, "", false
	}
	first, _ := branches[0].DocumentOK()
	at, ok = first.Lookup("recorded_at", "$lt").DateTimeOK()
	second, _ := branches[1].DocumentOK()
	id, idOK := second.Lookup("_id", "$lt").StringValueOK()
	if !ok || !idOK {
		return 0, "", false
	}
	want, err := bson.Marshal(bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: bson.DateTime(at)}}}},
		bson.D{{Key: "recorded_at", Value: bson.DateTime(at)}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: id}}}},
	}}})
	return at, id, err == nil && string(bson.Raw(want).Lookup("$or").Value) == string(v.Value)
}

// servePage serves a find of the log's pages on c, reading the documents
// back on up (the client's own upstream connection); served is false
// for any other command.
func (f *funnel) servePage(up, c net.Conn, req []byte, cmd command) (served bool, err error) {
	if cmd.name != "find" || cmd.collection != LogCollection {
		return false, nil
	}
	q, ok := parsePage(cmd.msg.body())
	if !ok {
		return false, nil
	}
	ids, err := f.pageIDs(cmd.db, q)
	if err != nil {
		return true, answer(c, req, cmd, refusal(1, "InternalError", "find: "+err.Error()))
	}
	docs := bson.A{}
	for _, id := range ids {
		doc, err := readBack(up, cmd.db, cmd.collection, id, nil)
		if err != nil {
			return true, err
		}
		if doc != nil { // none: not there any more
			docs = append(docs, doc)
		}
	}
	return true, answer(c, req, cmd, bson.D{{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: docs},
		{Key: "id", Value: int64(0)}, {Key: "ns", Value: cmd.db + "." + cmd.collection}}}, {Key: "ok", Value: 1.0}})
}

// pageIDs reads the _ids of q's page from the log's indexes.
func (f *funnel) pageIDs(db string, q pageQuery) ([]string, error) {
	h, err := f.streams.handle(db)
	if err != nil || h == nil {
		return nil, err
	}
	var table string
	err = h.QueryRow(`SELECT table_name FROM _ferretdb_collections WHERE name = ?`, LogCollection).Scan(&table)
	if errors.Is(err, sql.ErrNoRows) || isNoSuchTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	query, args := pageSQL(table, q)
	rows, err := h.QueryContext(context.Background(), query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id, types string
		if err := rows.Scan(&id, &types); err != nil {
			return nil, err
		}
		if types != "string date" {
			return nil, fmt.Errorf("commit %q of %s.%s: the types of its _id and recorded_at, %q, do not sort as on MongoDB here", id, db, LogCollection, types)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// pageSQL is the query of q's _ids in the log's table, and its arguments.
func pageSQL(table string, q pageQuery) (string, []any) {
	where, args := []string{"true"}, []any{}
	if q.correlation != "" {
		where, args = append(where, correlationExpr+" = ?"), append(args, q.correlation)
	}
	if q.bounded {
		where, args = append(where, fmt.Sprintf("(%s, %s) < (?, ?)", recordedExpr, idExpr)), append(args, q.at, q.id)
	}
	return fmt.Sprintf(`SELECT coalesce(%s, ''), coalesce(_ferretdb_sjson->>'$."$s".p._id.t', '') || ' ' ||
		coalesce(_ferretdb_sjson->>'$."$s".p.recorded_at.t', '') FROM %q WHERE %s ORDER BY %s DESC, %s DESC LIMIT ?`, idExpr, table, strings.Join(where, " AND "), recordedExpr, idExpr), append(args, q.limit)
}
