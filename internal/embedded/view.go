package embedded

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Views. The service names each read model's live collection with a view
// under the projection's own name, repointed with collMod at every switch
// (mongodb.Pointers.ShowLive), so that a person in mongosh finds the live
// read model where they look. FerretDB 1.24 has no views: its create
// answers NotImplemented (238) to viewOn and pipeline
// (internal/handler/msg_create.go, "create: support for field "viewOn"
// ... is not implemented yet"), and its collMod answers NotImplemented
// whatever it is given (internal/handler/msg_collmod.go). The funnel
// serves the one shape the service uses, a view with an empty pipeline
// (an alias of a collection), as MongoDB answers it, so the production
// code keeps one path:
//
//   - create {create: v, viewOn: c, pipeline: []} records the view in the
//     database's system.views collection (where MongoDB keeps its views,
//     in another shape), collMod {collMod: v, viewOn: c2} repoints it and
//     drop removes it; a create naming a collection or view that exists
//     answers NamespaceExists (48);
//   - find, aggregate, count, distinct, explain of these and getMore are
//     sent to the collection the view shows; listCollections lists the
//     views with type "view" (each is stored in the shape listCollections
//     answers, so FerretDB filters them with the client's filter);
//   - writes and index commands addressed to a view, and listIndexes,
//     answer CommandNotSupportedOnView (166), as on MongoDB; writes to
//     system.views itself are refused (it is the funnel's record).
//
// A view with a non-empty pipeline answers NotImplemented (238).

// viewsCollection holds a database's views, one document per view.
const viewsCollection = "system.views"

// Error codes from MongoDB's error_codes.yml.
const (
	codeBadValue        = 2
	codeInvalidNS       = 73
	codeNamespaceExists = 48
	codeNotImplemented  = 238
	codeViewNotSupport  = 166
)

// views caches each database's views (view name → the collection it
// shows). Only the funnel's write connection changes them, so once a
// database's views are read the cache stays right; a read that raced a
// change (gen moved meanwhile) is used once and not kept.
type views struct {
	mu  sync.Mutex
	gen uint64
	dbs map[string]map[string]string // absent until read; replaced, never changed in place
}

// of returns the views of db, read on up unless cached. An error means up
// failed; a store that refuses the read (an invalid database name) has no
// views.
func (v *views) of(up net.Conn, db string) (map[string]string, error) {
	v.mu.Lock()
	m, ok := v.dbs[db]
	gen := v.gen
	v.mu.Unlock()
	if ok {
		return m, nil
	}
	reply, err := roundTrip(up, bson.D{{Key: "find", Value: viewsCollection}, {Key: "batchSize", Value: int32(100_000)},
		{Key: "singleBatch", Value: true}, {Key: "$db", Value: db}})
	if err != nil {
		return nil, err
	}
	m = map[string]string{}
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		return m, nil
	}
	for _, d := range firstBatch(reply) {
		name, _ := d.Lookup("name").StringValueOK()
		on, _ := d.Lookup("options", "viewOn").StringValueOK()
		if name != "" && on != "" {
			m[name] = on
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if cur, ok := v.dbs[db]; ok {
		return cur, nil
	}
	if v.gen == gen {
		if v.dbs == nil {
			v.dbs = map[string]map[string]string{}
		}
		v.dbs[db] = m
	}
	return m, nil
}

// set records view name of db as showing on ("" removes it).
func (v *views) set(db, name, on string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen++
	cur, ok := v.dbs[db]
	if !ok {
		return // read from the store when next needed
	}
	m := maps.Clone(cur)
	if on == "" {
		delete(m, name)
	} else {
		m[name] = on
	}
	v.dbs[db] = m
}

// forget drops what is known of db's views (the database was dropped).
func (v *views) forget(db string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen++
	delete(v.dbs, db)
}

// firstBatch returns the documents of a cursor reply's first batch.
func firstBatch(reply bson.Raw) []bson.Raw {
	arr, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := arr.Values()
	out := make([]bson.Raw, 0, len(vals))
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

// viewRead serves a read command that names a view (see the top of this
// file) on up, the client's own connection, and answers c; served is
// false when the command is left to relay as it is.
func (f *funnel) viewRead(up, c net.Conn, req []byte, cmd command) (served bool, err error) {
	name := strings.ToLower(cmd.name)
	switch name {
	case "find", "aggregate", "count", "distinct", "getmore", "explain", "listindexes", "listcollections":
	default:
		return false, nil
	}
	vs, err := f.views.of(up, cmd.db)
	if err != nil || len(vs) == 0 {
		return false, err
	}
	switch name {
	case "listcollections":
		return true, listWithViews(up, c, req, cmd)
	case "listindexes":
		if _, isView := vs[cmd.collection]; isView {
			return true, answer(c, req, cmd, notOnView(cmd))
		}
		return false, nil
	}
	if _, isView := vs[named(cmd)]; !isView {
		return false, nil // most reads: no decoding
	}
	var body bson.D
	if err := bson.Unmarshal(cmd.msg.body(), &body); err != nil || !retarget(body, vs) {
		return false, nil
	}
	raw, err := bson.Marshal(body)
	if err != nil {
		return false, nil
	}
	return true, relay(up, c, withBody(req, cmd.msg, raw))
}

// named is the collection a read command names: its first field's value,
// getMore's collection, or that of the command an explain wraps.
func named(cmd command) string {
	body := cmd.msg.body()
	switch strings.ToLower(cmd.name) {
	case "getmore":
		s, _ := body.Lookup("collection").StringValueOK()
		return s
	case "explain":
		inner, _ := body.Lookup("explain").DocumentOK()
		if elems, err := inner.Elements(); err == nil && len(elems) > 0 {
			s, _ := elems[0].Value().StringValueOK()
			return s
		}
		return ""
	}
	return cmd.collection
}

// retarget points a read command (or the command an explain wraps) that
// names a view at the collection the view shows, in place, and reports
// whether it did.
func retarget(body bson.D, vs map[string]string) bool {
	if len(body) == 0 {
		return false
	}
	i := 0
	switch strings.ToLower(body[0].Key) {
	case "explain":
		inner, ok := body[0].Value.(bson.D)
		return ok && retarget(inner, vs)
	case "getmore":
		i = -1
		for j, e := range body {
			if e.Key == "collection" {
				i = j
			}
		}
		if i < 0 {
			return false
		}
	}
	name, _ := body[i].Value.(string)
	on, isView := vs[name]
	if isView {
		body[i].Value = on
	}
	return isView
}

// listWithViews runs a listCollections on up and answers c with its
// collections and the views that match the command's filter.
func listWithViews(up, c net.Conn, req []byte, cmd command) error {
	if _, err := up.Write(req); err != nil {
		return err
	}
	resp, err := readMessage(up)
	if err != nil {
		return err
	}
	m := parseOpMsg(resp)
	if m == nil || m.body() == nil {
		_, err = c.Write(resp)
		return err
	}
	var reply bson.D
	if ok, _ := m.body().Lookup("ok").AsFloat64OK(); ok != 1 || bson.Unmarshal(m.body(), &reply) != nil {
		_, err = c.Write(resp)
		return err
	}
	body := cmd.msg.body()
	filter := bson.Raw(nil)
	if d, ok := body.Lookup("filter").DocumentOK(); ok {
		filter = d
	}
	find := bson.D{{Key: "find", Value: viewsCollection}, {Key: "batchSize", Value: int32(100_000)},
		{Key: "singleBatch", Value: true}, {Key: "$db", Value: cmd.db}}
	if filter != nil {
		find = append(find, bson.E{Key: "filter", Value: filter})
	}
	found, err := roundTrip(up, find)
	if err != nil {
		return err
	}
	nameOnly, _ := body.Lookup("nameOnly").BooleanOK()
	var listed bson.A
	for _, d := range firstBatch(found) {
		var doc bson.D
		if err := bson.Unmarshal(d, &doc); err != nil {
			continue
		}
		out := bson.D{}
		for _, e := range doc {
			if e.Key != "_id" && (!nameOnly || e.Key == "name") {
				out = append(out, e)
			}
		}
		listed = append(listed, out)
	}
	for i := range reply {
		cur, ok := reply[i].Value.(bson.D)
		if reply[i].Key != "cursor" || !ok {
			continue
		}
		for j := range cur {
			if batch, ok := cur[j].Value.(bson.A); ok && cur[j].Key == "firstBatch" {
				cur[j].Value = append(batch, listed...)
			}
		}
	}
	raw, err := bson.Marshal(reply)
	if err != nil {
		return err
	}
	_, err = c.Write(opMessage(raw, requestID(req)))
	return err
}

// viewWrite serves a write command (see the top of this file) that
// creates, repoints or drops a view, or names one, on the funnel's write
// connection, which the caller holds; served is false when the command
// is left to send as it is. An error means the connection failed.
func (f *funnel) viewWrite(c net.Conn, req []byte, cmd command) (served bool, err error) {
	name := strings.ToLower(cmd.name)
	if name == "dropdatabase" || cmd.collection == "" {
		return false, nil
	}
	if cmd.collection == viewsCollection {
		return true, answer(c, req, cmd, refusal(codeInvalidNS, "InvalidNamespace",
			fmt.Sprintf("cannot write to '%s.%s': the embedded store changes it on create, collMod and drop of a view", cmd.db, viewsCollection)))
	}
	vs, err := f.views.of(f.writer, cmd.db)
	if err != nil {
		return false, err
	}
	_, isView := vs[cmd.collection]
	body := cmd.msg.body()
	_, viewOnErr := body.LookupErr("viewOn")
	switch {
	case name == "create" && viewOnErr == nil:
		return true, f.putView(c, req, cmd, vs, true)
	case name == "collmod" && isView:
		if viewOnErr != nil {
			return true, answer(c, req, cmd, bson.D{{Key: "ok", Value: 1.0}})
		}
		return true, f.putView(c, req, cmd, vs, false)
	case name == "drop" && isView:
		reply, err := roundTrip(f.writer, bson.D{{Key: "delete", Value: viewsCollection},
			{Key: "deletes", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: cmd.collection}}}, {Key: "limit", Value: int32(1)}}}},
			{Key: "$db", Value: cmd.db}})
		if err != nil {
			return true, err
		}
		if refused := writeRefusal(reply); refused != nil {
			return true, answer(c, req, cmd, refused)
		}
		f.views.set(cmd.db, cmd.collection, "")
		return true, answer(c, req, cmd, bson.D{{Key: "ns", Value: cmd.db + "." + cmd.collection}, {Key: "ok", Value: 1.0}})
	case name == "create" && isView:
		return true, answer(c, req, cmd, nameTaken(cmd))
	case isView:
		return true, answer(c, req, cmd, notOnView(cmd))
	}
	return false, nil
}

// putView creates (create true) or repoints a view, from a create or
// collMod command with viewOn.
func (f *funnel) putView(c net.Conn, req []byte, cmd command, vs map[string]string, create bool) error {
	body := cmd.msg.body()
	on, _ := body.Lookup("viewOn").StringValueOK()
	if on == "" {
		return answer(c, req, cmd, refusal(codeBadValue, "BadValue", "viewOn must be the name of a collection"))
	}
	if p, err := body.LookupErr("pipeline"); err == nil {
		if arr, ok := p.ArrayOK(); !ok || len(arr) > 5 { // 5 bytes: an empty array
			return answer(c, req, cmd, refusal(codeNotImplemented, "NotImplemented",
				cmd.name+": the embedded store serves views with an empty pipeline only"))
		}
	}
	if create {
		if _, isView := vs[cmd.collection]; isView {
			return answer(c, req, cmd, nameTaken(cmd))
		}
		listed, err := roundTrip(f.writer, bson.D{{Key: "listCollections", Value: 1},
			{Key: "filter", Value: bson.D{{Key: "name", Value: cmd.collection}}}, {Key: "nameOnly", Value: true}, {Key: "$db", Value: cmd.db}})
		if err != nil {
			return err
		}
		if len(firstBatch(listed)) > 0 {
			return answer(c, req, cmd, nameTaken(cmd))
		}
	}
	doc := bson.D{{Key: "_id", Value: cmd.collection}, {Key: "name", Value: cmd.collection}, {Key: "type", Value: "view"},
		{Key: "options", Value: bson.D{{Key: "viewOn", Value: on}, {Key: "pipeline", Value: bson.A{}}}},
		{Key: "info", Value: bson.D{{Key: "readOnly", Value: true}}}}
	reply, err := roundTrip(f.writer, bson.D{{Key: "update", Value: viewsCollection},
		{Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{{Key: "_id", Value: cmd.collection}}}, {Key: "u", Value: doc}, {Key: "upsert", Value: true}}}},
		{Key: "$db", Value: cmd.db}})
	if err != nil {
		return err
	}
	if refused := writeRefusal(reply); refused != nil {
		return answer(c, req, cmd, refused)
	}
	if err := f.index.ensure(context.Background(), cmd.db, viewsCollection); err != nil {
		f.log.Warn("embedded store _id index", "db", cmd.db, "collection", viewsCollection, "err", err)
	}
	f.views.set(cmd.db, cmd.collection, on)
	return answer(c, req, cmd, bson.D{{Key: "ok", Value: 1.0}})
}

// writeRefusal is the command error to answer for a write the store
// refused (a command error or its first write error), nil when it
// succeeded.
func writeRefusal(reply bson.Raw) bson.D {
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		code, _ := reply.Lookup("code").AsInt64OK()
		msg, _ := reply.Lookup("errmsg").StringValueOK()
		name, _ := reply.Lookup("codeName").StringValueOK()
		return refusal(int32(code), name, msg)
	}
	if errs, ok := reply.Lookup("writeErrors").ArrayOK(); ok {
		if vals, _ := errs.Values(); len(vals) > 0 {
			we, _ := vals[0].DocumentOK()
			code, _ := we.Lookup("code").AsInt64OK()
			msg, _ := we.Lookup("errmsg").StringValueOK()
			return refusal(int32(code), "", msg)
		}
	}
	return nil
}

func refusal(code int32, codeName, msg string) bson.D {
	return bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: msg}, {Key: "code", Value: code}, {Key: "codeName", Value: codeName}}
}

// notOnView is MongoDB's answer to a write, an index command or
// listIndexes addressed to a view.
func notOnView(cmd command) bson.D {
	return refusal(codeViewNotSupport, "CommandNotSupportedOnView", fmt.Sprintf("Namespace %s.%s is a view, not a collection", cmd.db, cmd.collection))
}

// nameTaken is MongoDB's answer to a create of a name taken by a collection
// or a view.
func nameTaken(cmd command) bson.D {
	return refusal(codeNamespaceExists, "NamespaceExists", fmt.Sprintf("Collection %s.%s already exists.", cmd.db, cmd.collection))
}

// answer sends the funnel's own reply to the request req (parsed as cmd),
// unless the client asked for none (moreToCome).
func answer(c net.Conn, req []byte, cmd command, body bson.D) error {
	if cmd.msg.flags&flagMoreToCome != 0 {
		return nil
	}
	raw, err := bson.Marshal(body)
	if err != nil {
		return err
	}
	_, err = c.Write(opMessage(raw, requestID(req)))
	return err
}
