package embedded

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestLogPagesFromTheIndexes: the log's pages the funnel serves answer
// what FerretDB answers to the same find (sent with a comment, which the
// funnel leaves to FerretDB): the newest commits, those below a cursor's
// bound where recorded times tie, those of one correlation id; their
// query reads the funnel's indexes of the log's table in order, never the
// table itself; and a page over a commit whose recorded_at is not a date
// is FerretDB's.
func TestLogPagesFromTheIndexes(t *testing.T) {
	s, c := startStore(t, t.TempDir())
	ctx := t.Context()
	coll := c.Database("lp").Collection(LogCollection)
	base := time.UnixMilli(1_700_000_000_000).UTC()
	var docs []any
	for i := range 40 {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("o-%d:%010d", i%7, i)},
			{Key: "recorded_at", Value: base.Add(time.Duration(i/3) * time.Millisecond)}, // ties of three
			{Key: "events", Value: bson.A{bson.D{{Key: "correlation_id", Value: fmt.Sprintf("c-%d", i%5)}}}}})
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	below := func(ms int, id string) bson.A {
		at := base.Add(time.Duration(ms) * time.Millisecond)
		return bson.A{bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: at}}}},
			bson.D{{Key: "recorded_at", Value: at}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: id}}}}}
	}
	sort := bson.D{{Key: "recorded_at", Value: -1}, {Key: "_id", Value: -1}}
	ids := func(filter bson.D, opts *options.FindOptionsBuilder) []string {
		t.Helper()
		cur, err := coll.Find(ctx, filter, opts.SetSort(sort).SetLimit(7))
		if err != nil {
			t.Fatal(err)
		}
		var got []struct {
			ID string `bson:"_id"`
		}
		if err := cur.All(ctx, &got); err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(got))
		for i, d := range got {
			out[i] = d.ID
		}
		return out
	}
	for name, filter := range map[string]bson.D{
		"newest":                   {},
		"below a tie":              {{Key: "$or", Value: below(5, fmt.Sprintf("o-%d:%010d", 16%7, 16))}},
		"one correlation id":       {{Key: "events.correlation_id", Value: "c-3"}},
		"one correlation id below": {{Key: "events.correlation_id", Value: "c-3"}, {Key: "$or", Value: below(9, fmt.Sprintf("o-%d:%010d", 28%7, 28))}},
	} {
		served, scanned := ids(filter, options.Find()), ids(filter, options.Find().SetComment("scan"))
		if len(served) == 0 || !slices.Equal(served, scanned) {
			t.Errorf("%s: served %q, FerretDB answers %q", name, served, scanned)
		}
	}

	h, err := s.index.handle("lp")
	if err != nil {
		t.Fatal(err)
	}
	table, _, err := tableOf(h, LogCollection)
	if err != nil {
		t.Fatal(err)
	}
	at := bson.D{{Key: "$or", Value: below(1, "x")}}
	for _, filter := range []bson.D{{}, at, {{Key: "events.correlation_id", Value: "c"}}, append(bson.D{{Key: "events.correlation_id", Value: "c"}}, at...)} {
		body, err := bson.Marshal(bson.D{{Key: "find", Value: LogCollection}, {Key: "filter", Value: filter}, {Key: "sort", Value: sort}, {Key: "limit", Value: int64(7)}})
		if err != nil {
			t.Fatal(err)
		}
		q, ok, err := planFind(h, LogCollection, body)
		if err != nil || !ok {
			t.Fatalf("page %v: no plan (%v)", filter, err)
		}
		rows, err := h.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q.query, q.args...)
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
		p := strings.Join(plan, "; ")
		if !strings.Contains(p, "USING INDEX "+table+"_") || strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("page %v: plan %q, want a walk of an index in order", filter, p)
		}
	}

	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "o-9:0000000001"}, {Key: "recorded_at", Value: "not a date"}}); err != nil {
		t.Fatal(err)
	}
	if served, scanned := ids(bson.D{}, options.Find()), ids(bson.D{}, options.Find().SetComment("scan")); !slices.Equal(served, scanned) {
		t.Errorf("a page over a recorded_at that is no date: %q, FerretDB answers %q", served, scanned)
	}
}
