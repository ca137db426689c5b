package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// TestMongoshQueries runs every mongosh query of the "Opening the store
// with mongosh" sections of README.md and docs/embedded-store.md, as the Go
// driver sends it, on a live embedded store after a rebuild of
// order_summaries (the live collection is then the rebuild's, which the
// pointer names), and checks what the sections say of each answer. A
// query shown there that this test does not know fails it, and so does a
// claim FerretDB stops bearing out (an upgrade that implements $avg, say),
// so the sections cannot go stale unnoticed.
func TestMongoshQueries(t *testing.T) {
	readme := docSection(t, "../../README.md", "### Opening the store with mongosh")
	doc := docSection(t, "../../docs/embedded-store.md", "## Opening the store with mongosh")
	def := DefaultConfig()
	connect := "mongosh mongodb://" + def.Embedded.StoreAddr + "/" + def.Mongo.Database
	for name, text := range map[string]string{"README.md": readme, "docs/embedded-store.md": doc} {
		if !strings.Contains(text, connect) {
			t.Errorf("%s does not connect with %q, the default embedded store", name, connect)
		}
	}

	const token = "test-admin-token"
	m := runMainDir(t, t.TempDir(), func(c *Config) {
		c.HTTP.AdminToken = token
		c.Jobs.Settle = 200 * time.Millisecond
	})
	ctx := t.Context()
	c := newClient(t, m)
	c.place("demo-1", "cust-7", 2, 4990, 1500)
	c.step("demo-1", "approve")
	c.place("demo-2", "cust-7", 1, 1990, 0)
	c.place("demo-3", "cust-8", 1, 990, 0)

	auth := []string{"Authorization", "Bearer " + token}
	var job jobs.Job
	c.must(202, "POST", "/v1/admin/projections/order_summaries/rebuilds", "", auth...).decode(t, &job)
	if !waitFor(60*time.Second, 50*time.Millisecond, func() bool {
		c.must(200, "GET", "/v1/admin/projections/order_summaries/rebuilds/"+job.ID, "", auth...).decode(t, &job)
		return job.State.Final()
	}) || job.State != jobs.StateSucceeded {
		t.Fatalf("rebuild: %+v", job)
	}

	db := m.mongo.Database(m.Config.Mongo.Database)
	var pointer projection.Pointer
	if err := db.Collection(mongodb.PointersCollection).FindOne(ctx, bson.D{{Key: "_id", Value: "order_summaries"}}).Decode(&pointer); err != nil {
		t.Fatalf("pointer: %v", err)
	}
	live := ""
	coll := func() *mongo.Collection {
		if live == "" {
			t.Fatal("a query uses live before the line that sets it")
		}
		return db.Collection(live)
	}
	notImplemented := func(err error, what string) {
		t.Helper()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(238) || !strings.Contains(err.Error(), "is not implemented yet") {
			t.Errorf("%s: %v; the docs say NotImplemented", what, err)
		}
		if !strings.Contains(doc, "is not implemented yet") {
			t.Errorf("the docs no longer quote FerretDB's answer for %s", what)
		}
	}
	explain := func(filter bson.D) (pushdown bool, plan string) {
		t.Helper()
		var out struct {
			FilterPushdown bool `bson:"filterPushdown"`
			QueryPlanner   bson.M
		}
		err := db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{{Key: "find", Value: live}, {Key: "filter", Value: filter}}},
			{Key: "verbosity", Value: "queryPlanner"}}).Decode(&out)
		if err != nil {
			t.Fatalf("explain %v: %v", filter, err)
		}
		return out.FilterPushdown, fmt.Sprint(out.QueryPlanner)
	}
	// group runs a $group on live and returns each group's fields.
	group := func(spec bson.D) map[string]bson.M {
		t.Helper()
		cur, err := coll().Aggregate(ctx, bson.A{bson.D{{Key: "$group", Value: spec}}})
		if err != nil {
			t.Fatalf("$group %v: %v", spec, err)
		}
		var rows []bson.M
		if err := cur.All(ctx, &rows); err != nil {
			t.Fatal(err)
		}
		out := map[string]bson.M{}
		for _, r := range rows {
			out[fmt.Sprint(r["_id"])] = r
		}
		return out
	}
	// folded are the orders per status and their totals, read in Go.
	folded := func() (orders, totals map[string]int64) {
		t.Helper()
		cur, err := coll().Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		var docs []struct {
			Status string `bson:"status"`
			Total  int64  `bson:"total_cents"`
		}
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatal(err)
		}
		orders, totals = map[string]int64{}, map[string]int64{}
		for _, d := range docs {
			orders[d.Status]++
			totals[d.Status] += d.Total
		}
		return orders, totals
	}
	num := func(v any) int64 {
		switch n := v.(type) {
		case int32:
			return int64(n)
		case int64:
			return n
		case float64:
			return int64(n)
		}
		t.Fatalf("%v (%T) is not a number", v, v)
		return 0
	}

	queries := map[string]func(){
		`db.events.findOne({_id: "demo-1:0000000001"})`: func() {
			id := mongodb.CommitID("demo-1", 1)
			if id != "demo-1:0000000001" || !strings.Contains(doc, "_id: '"+id+"'") {
				t.Errorf("a commit's _id is %q; the docs show another", id)
			}
			var d struct {
				StreamID string `bson:"stream_id"`
				First    int64  `bson:"first_version"`
			}
			if err := db.Collection(mongodb.CommitsCollection).FindOne(ctx, bson.D{{Key: "_id", Value: "demo-1:0000000001"}}).Decode(&d); err != nil || d.StreamID != "demo-1" || d.First != 1 {
				t.Errorf("commit demo-1:0000000001: %+v, %v", d, err)
			}
		},
		`db.events.find({stream_id: "demo-1"}).sort({first_version: 1})`: func() {
			cur, err := db.Collection(mongodb.CommitsCollection).Find(ctx, bson.D{{Key: "stream_id", Value: "demo-1"}},
				options.Find().SetSort(bson.D{{Key: "first_version", Value: 1}}))
			if err != nil {
				t.Fatal(err)
			}
			var commits []struct {
				First int64 `bson:"first_version"`
			}
			if err := cur.All(ctx, &commits); err != nil || len(commits) != 2 || commits[0].First != 1 || commits[1].First != 2 {
				t.Errorf("the commits of demo-1: %+v, %v; want versions 1 and 2", commits, err)
			}
		},
		`db.projection_pointers.findOne({_id: "order_summaries"})`: func() {
			t.Logf("pointer after the rebuild: %+v", pointer)
			if want := projection.VersionKey("order_summaries", projection.OrderSummaries.Ver()) + "_" + strings.ReplaceAll(job.ID, "-", ""); pointer.Active != want {
				t.Errorf("active collection %q after rebuild %s, want %q", pointer.Active, job.ID, want)
			}
			shown := regexp.MustCompile(`active: '(order_summaries_[v0-9a-f_]*)'`).FindStringSubmatch(doc)
			real := regexp.MustCompile(`^order_summaries_v[0-9]+_[0-9a-f]{32}$`)
			if shown == nil || !real.MatchString(shown[1]) || !real.MatchString(pointer.Active) {
				t.Errorf("the docs show the pointer's active collection as %q; a real one is %q", shown, pointer.Active)
			}
		},
		`const live = db.projection_pointers.findOne({_id: "order_summaries"}).active`: func() {
			live = pointer.Active
		},
		`db.getCollection(live).findOne({_id: "demo-1"})`: func() {
			var o struct {
				Status  string `bson:"status"`
				Version int64  `bson:"version"`
			}
			if err := coll().FindOne(ctx, bson.D{{Key: "_id", Value: "demo-1"}}).Decode(&o); err != nil || o.Status != "approved" || o.Version != 2 {
				t.Errorf("demo-1 in the live collection %s: %+v, %v; want approved at version 2", live, o, err)
			}
		},
		`db.getCollection(live).getIndexes()`: func() {
			cur, err := coll().Indexes().List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var ixs []struct {
				Key bson.D `bson:"key"`
			}
			if err := cur.All(ctx, &ixs); err != nil {
				t.Fatal(err)
			}
			var first []string
			for _, ix := range ixs {
				first = append(first, ix.Key[0].Key)
			}
			if !slices.Contains(first, "customer_id") || !slices.Contains(first, "status") {
				t.Errorf("indexes of %s lead with %v; the docs say customer_id and status", live, first)
			}
		},
		`db.getCollection(live).find({customer_id: "cust-7"}).explain()`: func() {
			if pushdown, plan := explain(bson.D{{Key: "customer_id", Value: "cust-7"}}); pushdown || !strings.Contains(plan, "SCAN") {
				t.Errorf("a filter on customer_id: pushdown %v, plan %s; the docs say a scan", pushdown, plan)
			}
		},
		`db.getCollection(live).find({customer_id: "cust-7"}).sort({_id: 1}).limit(50)`: func() {
			cur, err := coll().Find(ctx, bson.D{{Key: "customer_id", Value: "cust-7"}},
				options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(50))
			if err != nil {
				t.Fatal(err)
			}
			var got []struct {
				ID       string `bson:"_id"`
				Customer string `bson:"customer_id"`
				Status   string `bson:"status"`
			}
			if err := cur.All(ctx, &got); err != nil {
				t.Fatal(err)
			}
			shown := []string{"{ _id: 'demo-1', customer_id: 'cust-7', status: 'approved'", "{ _id: 'demo-2', customer_id: 'cust-7', status: 'created'"}
			if len(got) != 2 || got[0].ID != "demo-1" || got[0].Status != "approved" || got[1].ID != "demo-2" || got[1].Status != "created" {
				t.Errorf("cust-7's summaries in _id order: %+v; the docs show demo-1 approved, demo-2 created", got)
			}
			for _, d := range shown {
				if !strings.Contains(doc, d) {
					t.Errorf("the docs do not show %s", d)
				}
			}
		},
		`db.getCollection(live).find({_id: "demo-1"}).explain()`: func() {
			if pushdown, plan := explain(bson.D{{Key: "_id", Value: "demo-1"}}); !pushdown || !strings.Contains(plan, "USING INDEX") {
				t.Errorf("a filter on _id: pushdown %v, plan %s; the docs say an index", pushdown, plan)
			}
		},
		`db.getCollection(live).aggregate([{$group: {_id: "$status", orders: {$sum: 1}}}])`: func() {
			orders, _ := folded()
			got := group(bson.D{{Key: "_id", Value: "$status"}, {Key: "orders", Value: bson.D{{Key: "$sum", Value: 1}}}})
			for status, n := range orders {
				if num(got[status]["orders"]) != n {
					t.Errorf("$sum: 1 alone, %s: %v, want %d", status, got[status], n)
				}
				if example := fmt.Sprintf("{ _id: '%s', orders: %d }", status, n); !strings.Contains(doc, example) {
					t.Errorf("the docs do not show %s", example)
				}
			}
		},
		`db.getCollection(live).aggregate([{$group: {_id: "$status", orders: {$sum: 1}, total: {$sum: "$total_cents"}}}])`: func() {
			orders, totals := folded()
			got := group(bson.D{{Key: "_id", Value: "$status"}, {Key: "orders", Value: bson.D{{Key: "$sum", Value: 1}}},
				{Key: "total", Value: bson.D{{Key: "$sum", Value: "$total_cents"}}}})
			for status, n := range orders {
				if num(got[status]["orders"]) != n || num(got[status]["total"]) != 0 || totals[status] == 0 {
					t.Errorf("two accumulators, %s: %v; the docs say orders %d (right) and total 0 (not %d)", status, got[status], n, totals[status])
				}
			}
		},
		`db.getCollection(live).aggregate([{$group: {_id: "$status", total: {$sum: "$total_cents"}}}])`: func() {
			_, totals := folded()
			got := group(bson.D{{Key: "_id", Value: "$status"}, {Key: "total", Value: bson.D{{Key: "$sum", Value: "$total_cents"}}}})
			for status, sum := range totals {
				if num(got[status]["total"]) != sum {
					t.Errorf("$sum of total_cents alone, %s: %v, want %d", status, got[status], sum)
				}
			}
			if example := fmt.Sprintf("{ _id: 'approved', total: %d }", totals["approved"]); !strings.Contains(doc, example) {
				t.Errorf("the docs do not show %s", example)
			}
		},
		`db.getCollection(live).aggregate([{$group: {_id: "$status", avg: {$avg: "$total_cents"}}}])`: func() {
			_, err := coll().Aggregate(ctx, bson.A{bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$status"},
				{Key: "avg", Value: bson.D{{Key: "$avg", Value: "$total_cents"}}}}}}})
			notImplemented(err, "$avg")
		},
		`db.getCollection(live).aggregate([{$lookup: {from: "events", localField: "_id", foreignField: "stream_id", as: "commits"}}])`: func() {
			_, err := coll().Aggregate(ctx, bson.A{bson.D{{Key: "$lookup", Value: bson.D{{Key: "from", Value: "events"},
				{Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "stream_id"}, {Key: "as", Value: "commits"}}}}})
			notImplemented(err, "$lookup")
		},
	}

	for _, text := range []string{readme, doc} {
		for _, q := range shellQueries(text) {
			run, ok := queries[q]
			if !ok {
				t.Errorf("the docs show a query this test does not run: %s", q)
				continue
			}
			run()
		}
	}
}

// docSection returns the part of the Markdown file at path from the
// heading to the next heading of the same or a higher level.
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	level := strings.Index(heading, " ")
	var out strings.Builder
	in, fenced := false, false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(line, "#") {
			if n := strings.Index(line, " "); in && n > 0 && n <= level && strings.Trim(line[:n], "#") == "" {
				break
			}
			in = in || line == heading
		}
		if in {
			out.WriteString(line + "\n")
		}
	}
	if !in {
		t.Fatalf("%s has no section %q", path, heading)
	}
	return out.String()
}

// shellQueries returns the lines of a section's js code blocks, but
// comments (answers shown) and blank lines.
func shellQueries(section string) []string {
	var out []string
	js := false
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "```"):
			js = line == "```js"
		case js && line != "" && !strings.HasPrefix(line, "//"):
			out = append(out, line)
		}
	}
	return out
}
