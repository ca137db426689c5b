package storetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/internal/embedded"
)

// insertsOnly is the change-stream pipeline the outbox relay tails the log
// with, the one the embedded store serves: its inserts.
var insertsOnly = mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}}

// Error codes of a stream that cannot resume (MongoDB's error_codes.yml).
const (
	codeHistoryLost        = 286 // ChangeStreamHistoryLost
	codeInvalidResumeToken = 260
	codeFatalStreamError   = 280 // ChangeStreamFatalError
)

// csWait bounds a wait for events that only a broken stream exceeds.
const csWait = 30 * time.Second

// RunChangeStream is the change-stream conformance suite: what the outbox
// relay relies on when it tails a collection's inserts with
// Collection.Watch(insertsOnly) and keeps resume tokens as checkpoints.
// Each case runs on a fresh database of the test store (Database); the
// restart case starts an embedded store of its own, and is skipped on
// MONGODB_URI, whose server the test does not control.
func RunChangeStream(t *testing.T) {
	t.Run("CommitOrder", func(t *testing.T) { testStreamOrder(t, Database(t)) })
	t.Run("ResumeFromAnyToken", func(t *testing.T) { testResumeAnyToken(t, Database(t)) })
	t.Run("ResumeAcrossRestart", testResumeAcrossRestart)
	t.Run("RecreatedCollectionLost", func(t *testing.T) { testRecreatedLost(t, Database(t)) })
	t.Run("ForgottenTokenLost", func(t *testing.T) { testForgottenLost(t, Database(t)) })
}

// streamed is an event as the suite reads it.
type streamed struct {
	ID    string
	Token bson.Raw
	Doc   bson.Raw
}

// readEvents reads n events of cs.
func readEvents(t *testing.T, cs *mongo.ChangeStream, n int) []streamed {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), csWait)
	defer cancel()
	var out []streamed
	for len(out) < n {
		if !cs.Next(ctx) {
			t.Fatalf("after %d of %d events: %v", len(out), n, cs.Err())
		}
		var e struct {
			OperationType string   `bson:"operationType"`
			FullDocument  bson.Raw `bson:"fullDocument"`
		}
		if err := cs.Decode(&e); err != nil {
			t.Fatal(err)
		}
		if e.OperationType != "insert" {
			t.Fatalf("event %s: operationType %q", cs.Current, e.OperationType)
		}
		id, _ := e.FullDocument.Lookup("_id").StringValueOK()
		tok, _ := cs.Current.Lookup("_id").DocumentOK()
		out = append(out, streamed{ID: id, Token: tok, Doc: e.FullDocument})
	}
	return out
}

// noMore checks that cs has no further event now.
func noMore(t *testing.T, cs *mongo.ChangeStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), csWait)
	defer cancel()
	if cs.TryNext(ctx) {
		t.Fatalf("an event past the end: %s", cs.Current)
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
}

func ids(es []streamed) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

func watch(t *testing.T, coll *mongo.Collection, opts ...options.Lister[options.ChangeStreamOptions]) *mongo.ChangeStream {
	t.Helper()
	// A short await: noMore's getMore waits it out on an idle stream.
	opts = append([]options.Lister[options.ChangeStreamOptions]{options.ChangeStream().SetMaxAwaitTime(100 * time.Millisecond)}, opts...)
	cs, err := coll.Watch(t.Context(), insertsOnly, opts...)
	if err != nil {
		t.Fatalf("watch %s: %v", coll.Name(), err)
	}
	t.Cleanup(func() { _ = cs.Close(context.Background()) })
	return cs
}

// insert inserts docs into coll one at a time, in order.
func insert(t *testing.T, coll *mongo.Collection, docs ...bson.D) {
	t.Helper()
	for _, d := range docs {
		if _, err := coll.InsertOne(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
}

func csDoc(id string, i int) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "i", Value: int64(i)}, {Key: "payload", Value: bson.D{{Key: "s", Value: "x"}, {Key: "n", Value: bson.A{int32(1), 2.5}}}}}
}

// testStreamOrder: a stream reports every insert once, in commit order:
// inserts one after the other in their order, those of one insertMany in
// its order, and each writer's inserts in its order while several race;
// each with the document as inserted.
func testStreamOrder(t *testing.T, db *mongo.Database) {
	ctx := t.Context()
	coll := db.Collection("events")
	insert(t, coll, csDoc("before", 0)) // creates it; not reported
	cs := watch(t, coll)
	want := map[string]bson.Raw{}
	put := func(d bson.D) {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		want[d[0].Value.(string)] = b
	}
	var order []string
	for i := range 5 {
		d := csDoc(fmt.Sprintf("seq-%d", i), i)
		put(d)
		order = append(order, d[0].Value.(string))
		insert(t, coll, d)
	}
	var many []any
	for i := range 5 {
		d := csDoc(fmt.Sprintf("many-%d", i), i)
		put(d)
		order = append(order, d[0].Value.(string))
		many = append(many, d)
	}
	if _, err := coll.InsertMany(ctx, many); err != nil {
		t.Fatal(err)
	}
	got := readEvents(t, cs, len(order))
	if !slices.Equal(ids(got), order) {
		t.Fatalf("events %v, want %v", ids(got), order)
	}

	const writers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		for i := range each {
			put(csDoc(fmt.Sprintf("w%d-%02d", w, i), i))
		}
		wg.Go(func() {
			for i := range each {
				if _, err := coll.InsertOne(ctx, csDoc(fmt.Sprintf("w%d-%02d", w, i), i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	raced := readEvents(t, cs, writers*each)
	noMore(t, cs)
	for w := range writers {
		var mine []string
		for _, e := range raced {
			if len(e.ID) > 2 && e.ID[:2] == fmt.Sprintf("w%d", w) {
				mine = append(mine, e.ID)
			}
		}
		if len(mine) != each || !slices.IsSorted(mine) {
			t.Errorf("writer %d's events %v, want its %d inserts in order", w, mine, each)
		}
	}
	for _, e := range append(got, raced...) {
		if w, ok := want[e.ID]; !ok || string(w) != string(e.Doc) {
			t.Errorf("event %s: fullDocument %s, want %s", e.ID, e.Doc, w)
		}
	}
}

// testResumeAnyToken: a stream resumed after any event's token, or after
// the stream's token when idle, reports exactly the events after it.
func testResumeAnyToken(t *testing.T, db *mongo.Database) {
	ctx := t.Context()
	coll := db.Collection("events")
	cs := watch(t, coll)
	const n = 8
	var order []string
	for i := range n {
		id := fmt.Sprintf("e%02d", i)
		order = append(order, id)
		insert(t, coll, csDoc(id, i))
	}
	all := readEvents(t, cs, n)
	if !slices.Equal(ids(all), order) {
		t.Fatalf("events %v, want %v", ids(all), order)
	}
	for i, e := range all {
		r := watch(t, coll, options.ChangeStream().SetResumeAfter(e.Token))
		if rest := readEvents(t, r, n-1-i); !slices.Equal(ids(rest), order[i+1:]) {
			t.Fatalf("resume after the token of %s: %v, want %v", e.ID, ids(rest), order[i+1:])
		}
		noMore(t, r)
		_ = r.Close(ctx)
	}
	// The idle stream's token (its postBatchResumeToken) is past the last.
	noMore(t, cs)
	end := cs.ResumeToken()
	insert(t, coll, csDoc("after", n))
	r := watch(t, coll, options.ChangeStream().SetResumeAfter(end))
	if got := readEvents(t, r, 1); got[0].ID != "after" {
		t.Fatalf("resumed at the end: %v, want [after]", ids(got))
	}
	noMore(t, r)
}

// testResumeAcrossRestart: tokens outlive the store: a stream resumed after
// a restart on the same files reports exactly the later events, with the
// documents as inserted. Embedded store only.
func testResumeAcrossRestart(t *testing.T) {
	if os.Getenv("MONGODB_URI") != "" {
		t.Skip("MONGODB_URI names a server this test cannot restart")
	}
	dir := t.TempDir()
	ctx := t.Context()
	uri, stop := startOwnStore(t, dir)
	c := dial(t, options.Client().ApplyURI(uri))
	coll := c.Database("restart").Collection("events")
	cs := watch(t, coll)
	var docs []bson.Raw
	for i := range 6 {
		d := csDoc(fmt.Sprintf("r%d", i), i)
		b, _ := bson.Marshal(d)
		docs = append(docs, b)
		insert(t, coll, d)
	}
	readEvents(t, cs, 2)
	saved := cs.ResumeToken()
	_ = c.Disconnect(ctx)
	stop()

	uri, _ = startOwnStore(t, dir)
	c = dial(t, options.Client().ApplyURI(uri))
	r := watch(t, c.Database("restart").Collection("events"), options.ChangeStream().SetResumeAfter(saved))
	rest := readEvents(t, r, 4)
	for i, e := range rest {
		if e.ID != fmt.Sprintf("r%d", i+2) || string(e.Doc) != string(docs[i+2]) {
			t.Errorf("event %d after the restart: %s %s, want r%d %s", i, e.ID, e.Doc, i+2, docs[i+2])
		}
	}
	noMore(t, r)
}

// startOwnStore starts an embedded store on dir as MongoURI does
// (startStore) and returns its URI and a stop function, also run in
// cleanup.
func startOwnStore(t *testing.T, dir string) (string, func()) {
	t.Helper()
	uri, closeStore, err := startStore(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() { _ = closeStore() })
	t.Cleanup(stop)
	return uri, stop
}

// cannotResume checks that a stream resumed after token fails, at once or
// at its first getMore, with one of codes.
func cannotResume(t *testing.T, coll *mongo.Collection, token bson.Raw, codes ...int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), csWait)
	defer cancel()
	cs, err := coll.Watch(ctx, insertsOnly, options.ChangeStream().SetResumeAfter(token))
	if err == nil {
		defer cs.Close(context.Background())
		if cs.TryNext(ctx) {
			t.Fatalf("resumed after a lost token: event %s", cs.Current)
		}
		err = cs.Err()
	}
	var se mongo.ServerError
	if !errors.As(err, &se) || !slices.ContainsFunc(codes, se.HasErrorCode) {
		t.Fatalf("resume after a lost token: %v, want error code %v", err, codes)
	}
}

// testRecreatedLost: a token of a collection that was dropped and created
// again cannot resume the new one. The embedded store answers
// ChangeStreamHistoryLost (286); MongoDB's answer depends on its version
// and on what of the oplog is left (the token's position is past an
// invalidate): 286, 260 or 280 are accepted there.
func testRecreatedLost(t *testing.T, db *mongo.Database) {
	ctx := t.Context()
	coll := db.Collection("events")
	cs := watch(t, coll)
	insert(t, coll, csDoc("old", 0))
	old := readEvents(t, cs, 1)[0].Token
	_ = cs.Close(ctx)
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	insert(t, coll, csDoc("new", 0))
	codes := []int{codeHistoryLost}
	if os.Getenv("MONGODB_URI") != "" {
		codes = append(codes, codeInvalidResumeToken, codeFatalStreamError)
	}
	cannotResume(t, coll, old, codes...)
}

// testForgottenTokenLost: a token older than the history the store keeps
// answers ChangeStreamHistoryLost (the relay then catches up another
// way). Only the embedded store can be told to forget
// (embedded.ForgetChangesCommand); MongoDB forgets when its oplog rolls
// over, which a test cannot bring about.
func testForgottenLost(t *testing.T, db *mongo.Database) {
	if os.Getenv("MONGODB_URI") != "" {
		t.Skip("MongoDB has no command to forget change-stream history (its oplog rolls over on its own)")
	}
	ctx := t.Context()
	coll := db.Collection("events")
	cs := watch(t, coll)
	for i := range 3 {
		insert(t, coll, csDoc(fmt.Sprintf("f%d", i), i))
	}
	es := readEvents(t, cs, 3)
	_ = cs.Close(ctx)
	if err := db.RunCommand(ctx, bson.D{{Key: embedded.ForgetChangesCommand, Value: coll.Name()}}).Err(); err != nil {
		t.Fatalf("%s: %v", embedded.ForgetChangesCommand, err)
	}
	// Every position before the end needs a forgotten insert; the last
	// event's (the end) needs none.
	for _, e := range es[:len(es)-1] {
		cannotResume(t, coll, e.Token, codeHistoryLost)
	}
	last := watch(t, coll, options.ChangeStream().SetResumeAfter(es[len(es)-1].Token))
	noMore(t, last)
	// History from now on is kept.
	fresh := watch(t, coll)
	insert(t, coll, csDoc("kept", 9))
	kept := readEvents(t, fresh, 1)
	if kept[0].ID != "kept" {
		t.Fatalf("after forgetting: %v, want [kept]", ids(kept))
	}
	r := watch(t, coll, options.ChangeStream().SetResumeAfter(kept[0].Token))
	noMore(t, r)
}
