package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/mongodb"
)

// logMetadataWrites are the writes to the event log's collection, besides
// inserts, that change no commit: its creation and its indexes.
var logMetadataWrites = []string{"create", "createindexes", "dropindexes"}

// logRewrites returns the kinds of write the embedded store's writer ran
// on the event log other than inserts and its metadata ("update events
// x3"), from Main.StoreWrites: none on an insert-only log. A marker written
// on a commit, a commit deleted or replaced, shows as one.
func logRewrites(writes map[string]WriteCost) []string {
	var out []string
	for kind, c := range writes {
		command, coll, _ := strings.Cut(kind, " ")
		if coll != mongodb.CommitsCollection || command == "insert" || slices.Contains(logMetadataWrites, command) {
			continue
		}
		out = append(out, fmt.Sprintf("%s x%d", kind, c.Writes))
	}
	slices.Sort(out)
	return out
}

// assertInsertOnly fails t when m's embedded store wrote the event log
// other than by inserts since it started, or counted no insert of it (the
// count would then prove nothing). m must run the store in this process
// (runMainEmbedded): a store in a process of its own counts nothing here.
func assertInsertOnly(t *testing.T, m *Main) {
	t.Helper()
	writes := m.StoreWrites()
	if writes == nil {
		t.Fatal("no write counts: the embedded store does not run in this process")
	}
	if n := writes["insert "+mongodb.CommitsCollection].Writes; n == 0 {
		t.Fatalf("no insert into %s counted; the writes counted: %v", mongodb.CommitsCollection, writes)
	}
	if kinds := logRewrites(writes); len(kinds) > 0 {
		t.Errorf("the event log was written other than by inserts: %v; its commits must never change", kinds)
	}
}

// insertsOnly is the pipeline of an outside watch of the log, as an
// operator or another service would open it: the log's inserts.
var insertsOnly = mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}}

// watchedCommit is one change event of an outside watch: the commit's _id
// and its fullDocument as the stream delivered it.
type watchedCommit struct {
	ID  string
	Doc bson.Raw
}

// nextCommit waits up to 30 s for the next insert of cs.
func nextCommit(t *testing.T, cs *mongo.ChangeStream) watchedCommit {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if !cs.Next(ctx) {
		t.Fatalf("no next commit in the change stream within 30s: %v", cs.Err())
	}
	doc, ok := cs.Current.Lookup("fullDocument").DocumentOK()
	if !ok {
		t.Fatalf("change event without its fullDocument: %s", cs.Current)
	}
	id, _ := doc.Lookup("_id").StringValueOK()
	return watchedCommit{ID: id, Doc: slices.Clone(doc)}
}

// noMoreCommits checks that cs delivers nothing more within two seconds.
func noMoreCommits(t *testing.T, cs *mongo.ChangeStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for until := time.Now().Add(2 * time.Second); time.Now().Before(until); {
		if cs.TryNext(ctx) {
			doc, _ := cs.Current.Lookup("fullDocument").DocumentOK()
			id, _ := doc.Lookup("_id").StringValueOK()
			t.Errorf("the change stream delivered commit %s, beyond the commits sent", id)
			return
		}
		if err := cs.Err(); err != nil {
			t.Fatalf("change stream: %v", err)
		}
	}
}

// connectOutside opens a client of the store at uri of its own, as an
// outside reader would, disconnected when the test ends.
func connectOutside(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// TestOutsideWatchResumesAcrossARestart watches the log's inserts from
// outside the service, as another service would consume it, across a
// restart of the whole service on the same data: a stream resumed after
// the restart from a token saved before it delivers exactly the commits
// after that token, the ones inserted before the restart and after it, in
// the order they were inserted, and each with the document the log holds,
// byte for byte: the log's commits never change once inserted (the relay
// writes no marker on them).
func TestOutsideWatchResumesAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	m := runMainDir(t, dir)
	c := newClient(t, m)
	ctx := t.Context()
	c.place("watch-1", "cust-watch", 1, 1000, 0) // before the watch opens: not in it

	out := connectOutside(t, m.Config.Mongo.URI)
	events := out.Database(m.Config.Mongo.Database).Collection(mongodb.CommitsCollection)
	cs, err := events.Watch(ctx, insertsOnly, options.ChangeStream().SetMaxAwaitTime(500*time.Millisecond))
	if err != nil {
		t.Fatalf("watch the log: %v", err)
	}
	// Each command's commit is received before the next command is sent,
	// so the token saved is the position right after a known commit.
	send := func(orderID, step string) string {
		t.Helper()
		var version int64
		if step == "place" {
			version = c.place(orderID, "cust-watch", 1, 1000, 0).Version
		} else {
			version = c.step(orderID, step).Version
		}
		return mongodb.CommitID(orderID, version)
	}
	var before []watchedCommit // received before the restart
	for _, s := range [][2]string{{"watch-1", "approve"}, {"watch-2", "place"}} {
		want := send(s[0], s[1])
		got := nextCommit(t, cs)
		if got.ID != want {
			t.Fatalf("%s %s: the stream delivered commit %s, want %s", s[1], s[0], got.ID, want)
		}
		before = append(before, got)
	}
	saved := cs.ResumeToken()
	if saved == nil {
		t.Fatal("no resume token after two commits")
	}
	// Inserted after the saved token and received before the restart:
	// the resumed stream must deliver it again, unchanged.
	want := []string{send("watch-1", "ship")}
	if got := nextCommit(t, cs); got.ID != want[0] {
		t.Fatalf("ship watch-1: the stream delivered commit %s, want %s", got.ID, want[0])
	} else {
		before = append(before, got)
	}
	if err := cs.Close(ctx); err != nil {
		t.Errorf("close the change stream: %v", err)
	}
	if err := out.Disconnect(ctx); err != nil {
		t.Errorf("disconnect: %v", err)
	}
	firstURI := m.Config.Mongo.URI
	closeMain(t, m)

	m = runMainDir(t, dir)
	c = newClient(t, m)
	t.Logf("the store at %s before the restart, %s after it", firstURI, m.Config.Mongo.URI)
	want = append(want, send("watch-2", "approve"), send("watch-1", "deliver"), send("watch-3", "place"))
	// The relay publishes the log after the restart too.
	c.summaryEqualsOrder("watch-1", 4)
	c.summaryEqualsOrder("watch-2", 2)
	c.summaryEqualsOrder("watch-3", 1)

	out = connectOutside(t, m.Config.Mongo.URI)
	events = out.Database(m.Config.Mongo.Database).Collection(mongodb.CommitsCollection)
	resumed, err := events.Watch(ctx, insertsOnly, options.ChangeStream().SetResumeAfter(saved).SetMaxAwaitTime(500*time.Millisecond))
	if err != nil {
		t.Fatalf("resume the watch after the restart: %v", err)
	}
	defer resumed.Close(context.WithoutCancel(ctx))
	var got []watchedCommit
	for range want {
		got = append(got, nextCommit(t, resumed))
	}
	ids := make([]string, len(got))
	for i, g := range got {
		ids[i] = g.ID
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("the stream resumed after the restart delivered %v; want %v", ids, want)
	}
	noMoreCommits(t, resumed)

	// Each document delivered, before the restart or after it, is the one
	// the log holds now, byte for byte.
	for _, w := range append(before, got...) {
		stored, err := events.FindOne(ctx, bson.D{{Key: "_id", Value: w.ID}}).Raw()
		if err != nil {
			t.Fatalf("read commit %s: %v", w.ID, err)
		}
		if !bytes.Equal(w.Doc, stored) {
			t.Errorf("commit %s as the stream delivered it differs from the log's:\nstream %s\nlog    %s", w.ID, w.Doc, stored)
		}
	}
	if !bytes.Equal(before[2].Doc, got[0].Doc) {
		t.Errorf("commit %s delivered before the restart and after it differs:\nbefore %s\nafter  %s", got[0].ID, before[2].Doc, got[0].Doc)
	}
	// The whole log holds the seven commits sent, none other.
	n, err := events.CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Errorf("the log holds %d commits; want the 7 sent", n)
	}
}
