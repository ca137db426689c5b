package embedded

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The log browser's pages, find events {filter: F, sort: {recorded_at: -1,
// _id: -1}, limit: n}, where F is {}, {"events.correlation_id": c}, a
// cursor's bound {$or: [{recorded_at: {$lt: t}}, {recorded_at: t, _id:
// {$lt: id}}]}, or c and a bound, served from SQLite expression indexes of
// the log's table (logIndexes; docs/embedded-store.md, "The log browser").
// A commit's events share one correlation id, so the index holds the
// first event's.

// LogCollection is the collection of the event log (the mongodb
// package's CommitsCollection).
const LogCollection = "events"

const (
	recordedExpr    = `_ferretdb_sjson->>'$.recorded_at'`
	correlationExpr = `_ferretdb_sjson->>'$.events[0].correlation_id'`
)

// logIndexes are the SQLite indexes of the log's table that serve its
// pages, by name suffix.
var logIndexes = map[string]string{
	"_recorded_path":    recordedExpr + ", " + idExpr,
	"_correlation_path": correlationExpr + ", " + recordedExpr + ", " + idExpr,
}

// logPage is the query of a log page in the log's table; ok is false for
// any other find.
func logPage(sort bson.Raw, conds []bson.RawElement) (q sqlFind, ok bool) {
	if !sortedBy(sort, -1, "recorded_at", "_id") {
		return q, false
	}
	for _, c := range conds {
		switch v := c.Value(); c.Key() {
		case "events.correlation_id":
			corr, isString := v.StringValueOK()
			if !isString {
				return q, false
			}
			q.and(correlationExpr+" = ?", corr)
		case "$or":
			at, id, isBound := parseBound(v)
			if !isBound {
				return q, false
			}
			q.and(fmt.Sprintf("(%s, %s) < (?, ?)", recordedExpr, idExpr), at, id)
		default:
			return q, false
		}
	}
	q.sorts = fmt.Sprintf(`(%s) || ' ' || (%s) IS 'string date'`, idType, `_ferretdb_sjson->>'$."$s".p.recorded_at.t'`)
	q.order = recordedExpr + " DESC, " + idExpr + " DESC"
	return q, true
}

// parseBound reads the cursor's bound {$or: [{recorded_at: {$lt: t}},
// {recorded_at: t, _id: {$lt: id}}]}, as exactly that; t in ms since the
// epoch.
func parseBound(v bson.RawValue) (at int64, id string, ok bool) {
	at, ok = bson.Raw(v.Value).Lookup("0", "recorded_at", "$lt").DateTimeOK()
	id, idOK := bson.Raw(v.Value).Lookup("1", "_id", "$lt").StringValueOK()
	want, err := bson.Marshal(bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: bson.DateTime(at)}}}},
		bson.D{{Key: "recorded_at", Value: bson.DateTime(at)}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: id}}}},
	}}})
	return at, id, v.Type == bson.TypeArray && ok && idOK && err == nil && string(bson.Raw(want).Lookup("$or").Value) == string(v.Value)
}
