package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// insertsOnlyPipeline is the stream the embedded store serves.
var insertsOnlyPipeline = mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}}

// codeCursorNotFound is MongoDB's answer to a getMore of no open cursor.
const codeCursorNotFound = 43

// within bounds a wait that only a deadlock would exceed.
const within = 30 * time.Second

type event struct {
	OperationType string   `bson:"operationType"`
	FullDocument  bson.Raw `bson:"fullDocument"`
	DocumentKey   bson.Raw `bson:"documentKey"`
	NS            struct {
		DB   string `bson:"db"`
		Coll string `bson:"coll"`
	} `bson:"ns"`
}

// nextIDs reads n events from cs and returns their documents' _ids,
// checking each event's shape against want (the documents by _id).
func nextIDs(t *testing.T, cs *mongo.ChangeStream, n int, want map[string]bson.Raw) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	var ids []string
	for len(ids) < n {
		if !cs.Next(ctx) {
			t.Fatalf("after %d of %d events: %v", len(ids), n, cs.Err())
		}
		var e event
		if err := cs.Decode(&e); err != nil {
			t.Fatal(err)
		}
		id, _ := e.FullDocument.Lookup("_id").StringValueOK()
		if e.OperationType != "insert" {
			t.Errorf("event %s: operationType %q", id, e.OperationType)
		}
		if k, _ := e.DocumentKey.Lookup("_id").StringValueOK(); k != id {
			t.Errorf("event %s: documentKey %s", id, e.DocumentKey)
		}
		if w, ok := want[id]; ok && !bytesEqual(w, e.FullDocument) {
			t.Errorf("event %s: fullDocument %s, want %s", id, e.FullDocument, w)
		}
		if _, err := cs.Current.LookupErr("_id", "_data"); err != nil {
			t.Errorf("event %s without a resume token: %s", id, cs.Current)
		}
		ids = append(ids, id)
	}
	return ids
}

func bytesEqual(a, b bson.Raw) bool { return string(a) == string(b) }

func doc(id string, v int) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "v", Value: int64(v)}, {Key: "nested", Value: bson.D{{Key: "a", Value: bson.A{1, "x"}}}}}
}

func marshal(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantServerCode(t *testing.T, what string, err error, code int) {
	t.Helper()
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(code) {
		t.Fatalf("%s: %v, want error code %d", what, err, code)
	}
}

// startToken opens a stream on coll and closes it again: the token to
// resume from.
func startToken(t *testing.T, coll *mongo.Collection) bson.Raw {
	t.Helper()
	cs, err := coll.Watch(t.Context(), insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	return cs.ResumeToken()
}

// resumeFrom opens a stream on coll after token, closed when the test
// ends.
func resumeFrom(t *testing.T, coll *mongo.Collection, token bson.Raw) *mongo.ChangeStream {
	t.Helper()
	cs, err := coll.Watch(t.Context(), insertsOnlyPipeline, options.ChangeStream().SetResumeAfter(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close(context.Background()) })
	return cs
}

// TestChangeStreamReportsInsertsInCommitOrder: a stream sees inserts, one
// by one and of an insertMany, in the order they were stored, with the
// documents as inserted (one is changed after its insert); a
// duplicate-key loser of an unordered insert never appears; an idle
// getMore is woken by an insert.
func TestChangeStreamReportsInsertsInCommitOrder(t *testing.T) {
	_, c := startStore(t, t.TempDir(), WithTestCommands())
	coll := c.Database("cs").Collection(LogCollection)
	ctx := t.Context()
	if _, err := coll.InsertOne(ctx, doc("before", 0)); err != nil {
		t.Fatal(err)
	}
	cs, err := coll.Watch(ctx, insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())

	want := map[string]bson.Raw{}
	var order []string
	for i := range 3 {
		d := doc(fmt.Sprintf("one-%d", i), i)
		want[fmt.Sprint(d[0].Value)] = marshal(t, d)
		order = append(order, fmt.Sprint(d[0].Value))
		if _, err := coll.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	var many []any
	for i := range 5 {
		d := doc(fmt.Sprintf("many-%d", i), 10+i)
		if i == 2 {
			d = doc("one-1", 99) // a duplicate key: stored nothing
		} else {
			want[fmt.Sprint(d[0].Value)] = marshal(t, d)
			order = append(order, fmt.Sprint(d[0].Value))
		}
		many = append(many, d)
	}
	_, err = coll.InsertMany(ctx, many, options.InsertMany().SetOrdered(false))
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("insertMany with a duplicate: %v", err)
	}
	// Reported as inserted: from the cache, at the rows the others took.
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "many-3"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: -1}}}}); err != nil {
		t.Fatal(err)
	}
	got := nextIDs(t, cs, len(order), want)
	if fmt.Sprint(got) != fmt.Sprint(order) {
		t.Fatalf("events %v, want %v", got, order)
	}

	// An idle stream's getMore waits, and an insert wakes it.
	next := make(chan []string, 1)
	go func() { next <- nextIDs(t, cs, 1, want) }()
	time.Sleep(50 * time.Millisecond) // lets the getMore start waiting; the test holds either way
	d := doc("late", 100)
	want["late"] = marshal(t, d)
	start := time.Now()
	if _, err := coll.InsertOne(ctx, d); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-next:
		if len(ids) != 1 || ids[0] != "late" {
			t.Fatalf("woken with %v, want [late]", ids)
		}
		t.Logf("event %v after its insert", time.Since(start))
	case <-time.After(within):
		t.Fatal("the insert did not wake the stream")
	}
}

// TestChangeStreamResumes: a stream resumed from a saved token reports
// exactly the later events, within one store and across a restart; a
// token of a re-created collection, or one forgotten with
// ForgetChangesCommand, answers ChangeStreamHistoryLost.
func TestChangeStreamResumes(t *testing.T) {
	dir := t.TempDir()
	s, c := startStore(t, dir, WithTestCommands())
	db := c.Database("cs")
	coll := db.Collection(LogCollection)
	ctx := t.Context()
	cs, err := coll.Watch(ctx, insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := coll.InsertOne(ctx, doc(fmt.Sprintf("d%d", i), i)); err != nil {
			t.Fatal(err)
		}
	}
	nextIDs(t, cs, 3, nil)
	saved := cs.ResumeToken()
	if err := cs.Close(ctx); err != nil { // killCursors
		t.Fatalf("close: %v", err)
	}
	resume := func(c *mongo.Client, token bson.Raw) (*mongo.ChangeStream, error) {
		return c.Database("cs").Collection(LogCollection).Watch(ctx, insertsOnlyPipeline, options.ChangeStream().SetResumeAfter(token))
	}
	cs, err = resume(c, saved)
	if err != nil {
		t.Fatal(err)
	}
	if got := nextIDs(t, cs, 3, nil); fmt.Sprint(got) != "[d3 d4 d5]" {
		t.Fatalf("resumed: %v, want [d3 d4 d5]", got)
	}
	_ = cs.Close(ctx)

	// Across a restart: the token is durable, the cache is gone (the
	// documents are read back).
	_ = c.Disconnect(ctx)
	_ = s.Close()
	s, c = startStore(t, dir, WithTestCommands())
	cs, err = resume(c, saved)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bson.Raw{"d4": marshal(t, doc("d4", 4))}
	if got := nextIDs(t, cs, 3, want); fmt.Sprint(got) != "[d3 d4 d5]" {
		t.Fatalf("resumed after a restart: %v, want [d3 d4 d5]", got)
	}
	_ = cs.Close(ctx)
	coll = c.Database("cs").Collection(LogCollection)

	// Forgotten history: the saved token answers 286; the end at the
	// forgetting (where a stream opened then starts) resumes, and so does a
	// stream opened afresh.
	cs, err = coll.Watch(ctx, insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	end := cs.ResumeToken()
	_ = cs.Close(ctx)
	if err := c.Database("cs").RunCommand(ctx, bson.D{{Key: ForgetChangesCommand, Value: LogCollection}}).Err(); err != nil {
		t.Fatalf("%s: %v", ForgetChangesCommand, err)
	}
	_, err = resume(c, saved)
	wantServerCode(t, "resume a forgotten token", err, codeChangeStreamHistLost)
	atEnd, err := resume(c, end)
	if err != nil {
		t.Fatalf("resume at the end of the forgotten history: %v", err)
	}
	if _, err := coll.InsertOne(ctx, doc("after-forget", 7)); err != nil {
		t.Fatal(err)
	}
	if !atEnd.Next(ctx) || atEnd.Current.Lookup("documentKey", "_id").StringValue() != "after-forget" {
		t.Fatalf("resumed at the end of the forgotten history: %v %s, want the insert after it", atEnd.Err(), atEnd.Current)
	}
	_ = atEnd.Close(ctx)

	// A re-created collection: its old tokens are of another collection.
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, doc("new", 0)); err != nil {
		t.Fatal(err)
	}
	_, err = resume(c, saved)
	wantServerCode(t, "resume a token of a dropped collection", err, codeChangeStreamHistLost)

	_, err = resume(c, bson.Raw(marshal(t, bson.D{{Key: "_data", Value: "00zz"}})))
	wantServerCode(t, "resume a malformed token", err, codeInvalidResumeToken)
}

// TestChangeStreamRefusals: the funnel serves the one stream the service
// opens and refuses every other, never answering it otherwise: a stream
// that would report more than inserts or match them otherwise, any option
// but resumeAfter, a database's stream, a killCursors of its cursors and
// FerretDB's together, and compact (which could renumber the rows streams
// are ordered by).
func TestChangeStreamRefusals(t *testing.T) {
	_, c := startStore(t, t.TempDir(), WithTestCommands())
	db := c.Database("cs")
	coll := db.Collection("c")
	ctx := t.Context()
	if _, err := coll.InsertOne(ctx, doc("a", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertMany(ctx, []any{doc("b", 2), doc("c", 3)}); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]mongo.Pipeline{
		"no $match":      {},
		"other types":    {{{Key: "$match", Value: bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "update"}}}}}}}},
		"inserts by $in": {{{Key: "$match", Value: bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert"}}}}}}}},
		"more conditions": {{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"},
			{Key: "fullDocument.v", Value: 1}}}}},
		"another stage": {insertsOnlyPipeline[0], {{Key: "$project", Value: bson.D{{Key: "fullDocument", Value: 1}}}}},
	} {
		_, err := coll.Watch(ctx, p)
		wantServerCode(t, name, err, codeNotImplemented)
	}
	cs, err := coll.Watch(ctx, insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]*options.ChangeStreamOptionsBuilder{
		"startAfter":           options.ChangeStream().SetStartAfter(cs.ResumeToken()),
		"startAtOperationTime": options.ChangeStream().SetStartAtOperationTime(&bson.Timestamp{T: 1}),
		"fullDocument":         options.ChangeStream().SetFullDocument(options.UpdateLookup),
		"showExpandedEvents":   options.ChangeStream().SetShowExpandedEvents(true),
	} {
		_, err := coll.Watch(ctx, insertsOnlyPipeline, o)
		wantServerCode(t, name, err, codeNotImplemented)
	}
	_, err = db.Watch(ctx, insertsOnlyPipeline)
	wantServerCode(t, "a database's stream", err, codeNotImplemented)
	found, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1))
	if err != nil || !found.Next(ctx) {
		t.Fatalf("find: %v", err)
	}
	err = db.RunCommand(ctx, bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{cs.ID(), found.ID()}}}).Err()
	wantServerCode(t, "killCursors of a stream and a find", err, codeNotImplemented)
	_ = cs.Close(ctx)
	_ = found.Close(ctx)

	for _, force := range []bool{false, true} {
		err := db.RunCommand(ctx, bson.D{{Key: "compact", Value: "c"}, {Key: "force", Value: force}}).Err()
		wantServerCode(t, fmt.Sprintf("compact (force %v)", force), err, codeCommandNotSupported)
	}
}

// TestForgetChangesNeedsTheTestOption: without WithTestCommands the
// command is relayed to FerretDB, which does not know it.
func TestForgetChangesNeedsTheTestOption(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	db := c.Database("cs")
	if _, err := db.Collection("c").InsertOne(t.Context(), doc("a", 1)); err != nil {
		t.Fatal(err)
	}
	if err := db.RunCommand(t.Context(), bson.D{{Key: ForgetChangesCommand, Value: "c"}}).Err(); err == nil {
		t.Fatalf("%s served without WithTestCommands", ForgetChangesCommand)
	}
}

// TestChangeStreamKillCursors: killCursors answers for the funnel's own
// cursors, and a getMore after it is CursorNotFound.
func TestChangeStreamKillCursors(t *testing.T) {
	_, c := startStore(t, t.TempDir(), WithTestCommands())
	db := c.Database("cs")
	ctx := t.Context()
	if _, err := db.Collection("c").InsertOne(ctx, doc("a", 1)); err != nil {
		t.Fatal(err)
	}
	var opened bson.Raw
	opened, err := db.RunCommand(ctx, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{
		bson.D{{Key: "$changeStream", Value: bson.D{}}}, insertsOnlyPipeline[0]}}, {Key: "cursor", Value: bson.D{}}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := opened.Lookup("cursor", "id").Int64OK()
	if !ok || id <= 0 {
		t.Fatalf("aggregate answered %s", opened)
	}
	if _, err := opened.LookupErr("cursor", "postBatchResumeToken", "_data"); err != nil {
		t.Fatalf("no postBatchResumeToken: %s", opened)
	}
	killed, err := db.RunCommand(ctx, bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{id}}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := killed.Lookup("cursorsKilled").Array().Values(); len(got) != 1 || got[0].Int64() != id {
		t.Fatalf("killCursors answered %s", killed)
	}
	err = db.RunCommand(ctx, bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "c"}}).Err()
	wantServerCode(t, "getMore of a killed cursor", err, codeCursorNotFound)
}

// TestChangeStreamReadsBackAfterRestart: after a restart the funnel has
// no cached documents and reads each back by its string _id; a stream
// whose document has another _id type answers an error, not a wrong
// event.
func TestChangeStreamReadsBackAfterRestart(t *testing.T) {
	dir := t.TempDir()
	s, c := startStore(t, dir, WithTestCommands())
	coll := c.Database("cs").Collection("ids")
	ctx := t.Context()
	cs, err := coll.Watch(ctx, insertsOnlyPipeline)
	if err != nil {
		t.Fatal(err)
	}
	start := cs.ResumeToken()
	_ = cs.Close(ctx)
	docs := []bson.D{
		{{Key: "_id", Value: "s"}, {Key: "v", Value: 1}},
		{{Key: "_id", Value: "t"}, {Key: "v", Value: 2}},
		{{Key: "_id", Value: bson.NewObjectID()}, {Key: "v", Value: 3}},
	}
	for _, d := range docs {
		if _, err := coll.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Disconnect(ctx)
	_ = s.Close()
	_, c = startStore(t, dir, WithTestCommands())
	cs, err = c.Database("cs").Collection("ids").Watch(ctx, insertsOnlyPipeline, options.ChangeStream().SetResumeAfter(start))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for i, d := range docs[:2] {
		if !cs.Next(wctx) {
			t.Fatalf("event %d: %v", i, cs.Err())
		}
		var e event
		if err := cs.Decode(&e); err != nil {
			t.Fatal(err)
		}
		if w := marshal(t, d); !bytesEqual(w, e.FullDocument) {
			t.Errorf("event %d: %s, want %s", i, e.FullDocument, w)
		}
	}
	if cs.Next(wctx) {
		t.Fatalf("an event for an ObjectId _id: %s", cs.Current)
	}
	if cs.Err() == nil {
		t.Fatal("no error for a document the funnel cannot read back")
	}
}

// TestChangeStreamKeepsWhatWasInsertedWhileClosed: a stream opened again
// after a time with none open reports the documents inserted meanwhile as
// they were inserted, as MongoDB does, from the funnel's cache: not as
// they are when read (this one was changed after its insert), which is
// what reading them back would give.
func TestChangeStreamKeepsWhatWasInsertedWhileClosed(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("closed").Collection(LogCollection)
	ctx := t.Context()
	start := startToken(t, coll)
	inserted := bson.D{{Key: "_id", Value: "a"}, {Key: "v", Value: 1}}
	if _, err := coll.InsertOne(ctx, inserted); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 2}}}}); err != nil {
		t.Fatal(err)
	}
	cs := resumeFrom(t, coll, start)
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if !cs.Next(wctx) {
		t.Fatalf("no event: %v", cs.Err())
	}
	var e event
	if err := cs.Decode(&e); err != nil {
		t.Fatal(err)
	}
	if w := marshal(t, inserted); !bytesEqual(w, e.FullDocument) {
		t.Errorf("the insert reported as %s, want it as inserted, %s", e.FullDocument, w)
	}
}

// TestChangeStreamAfterOtherWrites: the funnel places the documents it
// caches by counting the rows inserts add, so neither a write that adds or
// frees rows it cannot count (a delete, whose row the next insert takes,
// an unacknowledged insert, an upsert) nor an insert that adds none (a
// duplicate key) may shift them: a stream reports each insert with its
// own document.
func TestChangeStreamAfterOtherWrites(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("written").Collection(LogCollection)
	ctx := t.Context()
	start := startToken(t, coll)
	a, b, late, k, last := doc("a", 1), doc("b", 2), doc("late", 3), doc("k", 4), doc("last", 5)
	if _, err := coll.InsertMany(ctx, []any{a, b}); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "b"}}); err != nil {
		t.Fatal(err)
	}
	unacked := c.Database("written").Collection(LogCollection, options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	if _, err := unacked.InsertOne(ctx, late); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(within); ; { // stored before the next insert
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: "late"}})
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unacknowledged insert was not stored")
		}
	}
	if _, err := coll.InsertOne(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "up"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 9}}}},
		options.UpdateOne().SetUpsert(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, last); err != nil {
		t.Fatal(err)
	}
	// An insert that stores nothing adds no row.
	if _, err := coll.InsertOne(ctx, doc("last", 6)); !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("an insert of a taken _id: %v, want a duplicate key error", err)
	}
	final := doc("final", 7)
	if _, err := coll.InsertOne(ctx, final); err != nil {
		t.Fatal(err)
	}
	cs := resumeFrom(t, coll, start)
	want := map[string]bson.Raw{"a": marshal(t, a), "late": marshal(t, late), "k": marshal(t, k), "last": marshal(t, last), "final": marshal(t, final)}
	if got := nextIDs(t, cs, 6, want); fmt.Sprint(got) != "[a late k up last final]" {
		t.Fatalf("events %v, want [a late k up last final]", got)
	}
}

// TestChangeStreamGetMoresOneAfterAnother: clients that send a stream's
// getMores one after the other, each on whichever connection of their
// pool is free (as the driver does), never find the cursor in use: the
// funnel frees a cursor before it answers, as MongoDB does. Several
// streams are read at once, so that a funnel goroutine that has answered
// may wait for a processor before it goes on.
func TestChangeStreamGetMoresOneAfterAnother(t *testing.T) {
	const streams, inserts = 8, 1000
	s, c := startStore(t, t.TempDir())
	db := c.Database("cs")
	addr := strings.TrimSuffix(strings.TrimPrefix(s.URI, "mongodb://"), "/")
	var wg sync.WaitGroup
	for k := range streams {
		coll := fmt.Sprintf("c%d", k)
		var conns [2]net.Conn
		for i := range conns {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conns[i] = conn
		}
		opened, err := roundTrip(conns[0], bson.D{{Key: "aggregate", Value: coll}, {Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$changeStream", Value: bson.D{}}}, insertsOnlyPipeline[0]}}, {Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "cs"}})
		if err != nil {
			t.Fatal(err)
		}
		id, ok := opened.Lookup("cursor", "id").Int64OK()
		if !ok {
			t.Fatalf("aggregate answered %s", opened)
		}
		docs := make([]any, inserts)
		for i := range docs {
			docs[i] = doc(fmt.Sprint(i), i)
		}
		if _, err := db.Collection(coll).InsertMany(t.Context(), docs); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for i := range inserts {
				reply, err := roundTrip(conns[i%2], bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: coll},
					{Key: "batchSize", Value: int32(1)}, {Key: "$db", Value: "cs"}})
				if err != nil {
					t.Error(err)
					return
				}
				if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
					t.Errorf("%s: getMore %d, sent after the answer to the one before: %s", coll, i, reply)
					return
				}
				batch, _ := reply.Lookup("cursor", "nextBatch").Array().Values()
				if len(batch) != 1 || batch[0].Document().Lookup("documentKey", "_id").StringValue() != fmt.Sprint(i) {
					t.Errorf("%s: getMore %d answered %v, want the insert of %d", coll, i, batch, i)
					return
				}
			}
		})
	}
	wg.Wait()
}
