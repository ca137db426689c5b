package embedded

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// oddIDs are _ids whose JSON text sorts otherwise than the strings: JSON
// escapes '"', '\', '<', '>', '&' and U+2028, and a space or '!' sorts
// below the closing quote.
var oddIDs = []string{"a", "a b", "a!", `a"q`, "a<b", `a\z`, "a&", "ab", "a\u2028", "aé", "b", "a\x01"}

// findBody is a find of coll as the service sends it, sorted by _id with
// a limit (none for 0), in one batch.
func findBody(coll string, filter bson.D, limit int64, projection bson.D) bson.D {
	body := bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: filter}, {Key: "sort", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "batchSize", Value: int64(maxPage + 10)}}
	if limit != 0 {
		body = append(body, bson.E{Key: "limit", Value: limit})
	}
	if projection != nil {
		body = append(body, bson.E{Key: "projection", Value: projection})
	}
	return body
}

// indexFinds is a store with collections of odd _ids, and the means to
// ask its funnel and FerretDB the same find.
type indexFinds struct {
	t  *testing.T
	s  *Store
	c  *mongo.Client
	db string
	up net.Conn // to FerretDB itself
}

func newIndexFinds(t *testing.T) *indexFinds {
	s, c := startStore(t, t.TempDir())
	up, err := net.Dial("tcp", s.funnel.upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	return &indexFinds{t: t, s: s, c: c, db: "xf", up: up}
}

// fill inserts docs into coll after creating its indexes.
func (x *indexFinds) fill(coll string, indexes []bson.D, docs []any) {
	x.t.Helper()
	cl := x.c.Database(x.db).Collection(coll)
	for _, keys := range indexes {
		if _, err := cl.Indexes().CreateOne(x.t.Context(), mongo.IndexModel{Keys: keys}); err != nil {
			x.t.Fatal(err)
		}
	}
	if _, err := cl.InsertMany(x.t.Context(), docs); err != nil {
		x.t.Fatal(err)
	}
}

// served asks the funnel's serveFind for body; served is false when
// it leaves the find to FerretDB.
func (x *indexFinds) served(body bson.D) (docs []bson.Raw, served bool) {
	x.t.Helper()
	raw, err := bson.Marshal(append(body, bson.E{Key: "$db", Value: x.db}))
	if err != nil {
		x.t.Fatal(err)
	}
	req := opMessage(raw, 7)
	cmd, ok := parseCommand(req)
	if !ok {
		x.t.Fatalf("parse %v", body)
	}
	client, funnelSide := net.Pipe()
	defer client.Close()
	type result struct {
		served bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		s, err := x.s.funnel.serveFind(x.up, funnelSide, req, cmd)
		_ = funnelSide.Close()
		done <- result{s, err}
	}()
	var reply []byte
	if msg, err := readMessage(client); err == nil {
		reply = msg
	}
	r := <-done
	if r.err != nil {
		x.t.Fatalf("serve %v: %v", body, r.err)
	}
	if !r.served {
		return nil, false
	}
	m := parseOpMsg(reply)
	if m == nil {
		x.t.Fatalf("serve %v: no answer", body)
	}
	if ok, _ := m.body().Lookup("ok").AsInt64OK(); ok != 1 {
		x.t.Fatalf("serve %v: %s", body, m.body())
	}
	return firstBatch(m.body()), true
}

// ferret is FerretDB's own answer to body.
func (x *indexFinds) ferret(body bson.D) []bson.Raw {
	x.t.Helper()
	reply, err := roundTrip(x.up, append(body, bson.E{Key: "$db", Value: x.db}))
	if err != nil {
		x.t.Fatal(err)
	}
	if id, _ := reply.Lookup("cursor", "id").AsInt64OK(); id != 0 {
		x.t.Fatalf("FerretDB answered %v with a cursor: raise its batchSize", body)
	}
	return firstBatch(reply)
}

func sameDocs(a, b []bson.Raw) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func ids(docs []bson.Raw) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.Lookup("_id").String()
	}
	return out
}

// TestFindsInIDOrderAnswerAsFerretDB: the finds the funnel serves in _id
// order (a customer's page and the next, with a status, a status alone,
// every document, _id ranges of a rollup of a month, a year and ten
// years, with and without a projection or a limit) answer byte for byte what
// FerretDB answers, also where _ids, and the equality's value, have
// characters whose JSON text sorts otherwise than the string; the
// funnel's answer through the driver is the same.
func TestFindsInIDOrderAnswerAsFerretDB(t *testing.T) {
	x := newIndexFinds(t)
	var sums []any
	customers := []string{"c1", "c2", "c<3"}
	for i := range 60 {
		id := fmt.Sprintf("o-%02d", i)
		if i < len(oddIDs) {
			id = oddIDs[i]
		}
		sums = append(sums, bson.D{{Key: "_id", Value: id}, {Key: "customer_id", Value: customers[i%3]},
			{Key: "status", Value: []string{"x", "y"}[i/3%2]}, {Key: "total", Value: int64(i)}, {Key: "at", Value: bson.DateTime(i)}})
	}
	x.fill("sums", []bson.D{{{Key: "customer_id", Value: 1}, {Key: "_id", Value: 1}}, {{Key: "status", Value: 1}, {Key: "_id", Value: 1}}}, sums)
	var days []any
	for y := 2010; y < 2023; y++ {
		for m := 1; m <= 12; m++ {
			for _, cur := range []string{"BRL", "USD"} {
				days = append(days, bson.D{{Key: "_id", Value: fmt.Sprintf("%d-%02d|%s", y, m, cur)}, {Key: "orders", Value: int64(y*100 + m)}})
			}
		}
	}
	x.fill("rollup", nil, days)

	cust := func(c string, more ...bson.E) bson.D { return append(bson.D{{Key: "customer_id", Value: c}}, more...) }
	idRange := func(ops ...string) bson.E {
		var r bson.D
		for i := 0; i < len(ops); i += 2 {
			r = append(r, bson.E{Key: ops[i], Value: ops[i+1]})
		}
		return bson.E{Key: "_id", Value: r}
	}
	for name, body := range map[string]bson.D{
		"a customer":                       findBody("sums", cust("c1"), 50, nil),
		"a customer's first page":          findBody("sums", cust("c1"), 3, nil),
		"a customer's next page":           findBody("sums", cust("c1", idRange("$gt", "a b")), 3, nil),
		"a customer and a status":          findBody("sums", cust("c2", bson.E{Key: "status", Value: "y"}), 50, nil),
		"a customer whose id JSON escapes": findBody("sums", cust("c<3"), 50, nil),
		"a status":                         findBody("sums", bson.D{{Key: "status", Value: "x"}}, 7, nil),
		"every document":                   findBody("sums", bson.D{}, 9, nil),
		"odd _ids in a range":              findBody("sums", bson.D{idRange("$gt", "a", "$lte", "b")}, 50, nil),
		"_ids above a bound":               findBody("sums", bson.D{idRange("$gte", "a!")}, 50, nil),
		"bounds sharing an escaped prefix": findBody("sums", bson.D{idRange("$gte", "a<a", "$lte", "a<z")}, 50, nil),
		"a customer's stats fields":        findBody("sums", cust("c2"), 50, bson.D{{Key: "status", Value: 1}, {Key: "total", Value: 1}}),
		"projected with the filter's":      findBody("sums", cust("c2"), 50, bson.D{{Key: "customer_id", Value: true}, {Key: "_id", Value: 1}}),
		"a month":                          findBody("rollup", bson.D{idRange("$gte", "2017-11", "$lt", "2017-12")}, maxPage, nil),
		"a year":                           findBody("rollup", bson.D{idRange("$gte", "2017-01", "$lte", "2017-12|~")}, maxPage, nil),
		"ten years":                        findBody("rollup", bson.D{idRange("$gte", "2010-01", "$lt", "2020-01")}, maxPage, nil),
		"ten years, a page":                findBody("rollup", bson.D{idRange("$gte", "2010-01", "$lt", "2020-01")}, 5, nil),
		"ten years, no limit":              findBody("rollup", bson.D{idRange("$gte", "2010-01", "$lt", "2020-01")}, 0, nil),
		"a customer, no limit":             findBody("sums", cust("c1"), 0, nil),
	} {
		got, served := x.served(body)
		if !served {
			t.Errorf("%s: left to FerretDB, want served", name)
			continue
		}
		want := x.ferret(append(body, bson.E{Key: "comment", Value: "FerretDB's own"}))
		if len(want) == 0 || !sameDocs(got, want) {
			t.Errorf("%s: served %q, FerretDB answers %q", name, ids(got), ids(want))
		}
		var viaDriver bson.Raw
		if err := x.c.Database(x.db).RunCommand(t.Context(), body).Decode(&viaDriver); err != nil {
			t.Fatal(err)
		}
		if d := firstBatch(viaDriver); !sameDocs(d, want) {
			t.Errorf("%s through the funnel: %q, FerretDB answers %q", name, ids(d), ids(want))
		}
	}

	// The funnel answers a find it serves in one batch; FerretDB would
	// answer its first 101 documents and a cursor.
	var reply bson.Raw
	body := findBody("rollup", bson.D{idRange("$gte", "2010-01", "$lt", "2020-01")}, 0, nil)[:4] // no batchSize
	if err := x.c.Database(x.db).RunCommand(t.Context(), body).Decode(&reply); err != nil {
		t.Fatal(err)
	}
	if id, _ := reply.Lookup("cursor", "id").AsInt64OK(); id != 0 || len(firstBatch(reply)) != 240 {
		t.Errorf("ten years through the funnel: %d documents and cursor %d, want all 240 in one batch: not served", len(firstBatch(reply)), id)
	}
}

// TestFindsInIDOrderLeftToFerretDB: a find the funnel cannot answer as
// MongoDB would goes to FerretDB: an equality on a field some document
// holds as an array (MongoDB matches its elements), a candidate _id that
// is no string without an _id range (MongoDB sorts it apart), an
// equality no index starts with, another sort, more documents than one
// reply holds (maxPage), asked for or without a limit, a page some of
// whose candidates fail the filter. A residual equality on an array, and
// a range that excludes the _ids of other types, are served, and answer
// as FerretDB does.
func TestFindsInIDOrderLeftToFerretDB(t *testing.T) {
	x := newIndexFinds(t)
	byCustomer := []bson.D{{{Key: "customer_id", Value: 1}, {Key: "_id", Value: 1}}}
	x.fill("arrays", byCustomer, []any{
		bson.D{{Key: "_id", Value: "a"}, {Key: "customer_id", Value: "c1"}},
		bson.D{{Key: "_id", Value: "b"}, {Key: "customer_id", Value: bson.A{"c0", "c1"}}},
	})
	x.fill("tags", byCustomer, []any{
		bson.D{{Key: "_id", Value: "0"}, {Key: "customer_id", Value: "c1"}, {Key: "tag", Value: bson.A{"x"}}},
		bson.D{{Key: "_id", Value: "a"}, {Key: "customer_id", Value: "c1"}, {Key: "tag", Value: "t"}},
		bson.D{{Key: "_id", Value: "b"}, {Key: "customer_id", Value: "c1"}, {Key: "tag", Value: bson.A{"s", "t"}}},
		bson.D{{Key: "_id", Value: "c"}, {Key: "customer_id", Value: "c1"}, {Key: "tag", Value: bson.A{"s"}}},
	})
	x.fill("oids", byCustomer, []any{
		bson.D{{Key: "_id", Value: "a"}, {Key: "customer_id", Value: "c1"}},
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "customer_id", Value: "c1"}},
		bson.D{{Key: "_id", Value: int64(7)}, {Key: "customer_id", Value: "c1"}},
	})
	var many []any
	for i := range maxPage + 1 {
		many = append(many, bson.D{{Key: "_id", Value: fmt.Sprintf("m-%05d", i)}})
	}
	x.fill("many", nil, many)
	c1 := bson.D{{Key: "customer_id", Value: "c1"}}
	for name, body := range map[string]bson.D{
		"an array in the indexed field":      findBody("arrays", c1, 50, nil),
		"_ids of other types":                findBody("oids", c1, 50, nil),
		"no index":                           findBody("tags", bson.D{{Key: "tag", Value: "t"}}, 50, nil),
		"another sort":                       {{Key: "find", Value: "tags"}, {Key: "filter", Value: c1}, {Key: "sort", Value: bson.D{{Key: "_id", Value: -1}}}, {Key: "limit", Value: int64(5)}},
		"no limit, more than a reply":        findBody("many", bson.D{}, 0, nil),
		"a limit above a reply":              findBody("many", bson.D{}, maxPage+1, nil),
		"an exclusion":                       findBody("tags", c1, 50, bson.D{{Key: "tag", Value: 0}}),
		"a page past a candidate that fails": findBody("tags", append(c1, bson.E{Key: "tag", Value: "t"}), 2, nil),
	} {
		if got, served := x.served(body); served {
			t.Errorf("%s: served %q, want it left to FerretDB", name, ids(got))
		}
	}
	for name, body := range map[string]bson.D{
		"an array in a residual field": findBody("tags", append(c1, bson.E{Key: "tag", Value: "t"}), 50, nil),
		"a range over strings only":    findBody("oids", append(c1, bson.E{Key: "_id", Value: bson.D{{Key: "$gte", Value: ""}}}), 50, nil),
	} {
		got, served := x.served(body)
		want := x.ferret(append(body, bson.E{Key: "comment", Value: "FerretDB's own"}))
		if !served || len(want) == 0 || !sameDocs(got, want) {
			t.Errorf("%s: served %v %q, FerretDB answers %q", name, served, ids(got), ids(want))
		}
	}
}

// TestFindsInIDOrderUseTheIndexes: the candidates of a served find with
// an equality come from FerretDB's index of a customer's or a status's
// documents, never a scan of the table; only the candidates are sorted.
func TestFindsInIDOrderUseTheIndexes(t *testing.T) {
	x := newIndexFinds(t)
	x.fill("sums", []bson.D{{{Key: "customer_id", Value: 1}, {Key: "_id", Value: 1}}, {{Key: "status", Value: 1}, {Key: "_id", Value: 1}}},
		[]any{bson.D{{Key: "_id", Value: "a"}, {Key: "customer_id", Value: "c1"}, {Key: "status", Value: "x"}}})
	h, err := x.s.index.handle(x.db)
	if err != nil {
		t.Fatal(err)
	}
	table, _, err := tableOf(h, "sums")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		filter bson.D
		index  string
	}{
		"a customer":              {bson.D{{Key: "customer_id", Value: "c1"}}, "_customer_id_1__id_1"},
		"a customer's next page":  {bson.D{{Key: "customer_id", Value: "c1"}, {Key: "_id", Value: bson.D{{Key: "$gt", Value: "a"}}}}, "_customer_id_1__id_1"},
		"a customer and a status": {bson.D{{Key: "customer_id", Value: "c1"}, {Key: "status", Value: "x"}}, "_customer_id_1__id_1"},
		"a status":                {bson.D{{Key: "status", Value: "x"}}, "_status_1__id_1"},
	} {
		raw, err := bson.Marshal(findBody("sums", tc.filter, 50, nil))
		if err != nil {
			t.Fatal(err)
		}
		q, ok, err := planFind(h, "sums", raw)
		if err != nil || !ok {
			t.Fatalf("%s: no plan (%v)", name, err)
		}
		rows, err := h.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q.query, q.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		_ = rows.Close()
		s := strings.Join(plan, "; ")
		if !strings.Contains(s, "SEARCH "+table+" USING INDEX "+table+tc.index+" (") || strings.Contains(s, "SCAN "+table) {
			t.Errorf("%s: plan %q, want a search of %s", name, s, table+tc.index)
		}
	}
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
