package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

func exists(field string) bson.D {
	return bson.D{{Key: field, Value: bson.D{{Key: "$exists", Value: true}}}}
}

// TestUniqueIndexOverPresentFields: a unique index with the partial filter
// {f: {$exists: true}} is created (FerretDB refuses partial indexes) and
// keeps MongoDB's meaning: documents without f are never compared, those
// with f are unique on the whole key. Other partial indexes are refused,
// not silently widened: the service has none.
func TestUniqueIndexOverPresentFields(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	coll := c.Database("funnel").Collection("partial")
	model := mongo.IndexModel{
		Keys:    bson.D{{Key: "s", Value: 1}, {Key: "k", Value: 1}},
		Options: options.Index().SetUnique(true).SetName("s_k").SetPartialFilterExpression(exists("k")),
	}
	for i := range 2 { // again: a restart
		if _, err := coll.Indexes().CreateOne(t.Context(), model); err != nil {
			t.Fatalf("create index (%d): %v", i+1, err)
		}
	}
	docs := []bson.D{
		{{Key: "_id", Value: 1}, {Key: "s", Value: "a"}},
		{{Key: "_id", Value: 2}, {Key: "s", Value: "a"}}, // no k, same s: no collision
		{{Key: "_id", Value: 3}, {Key: "s", Value: "a"}, {Key: "k", Value: "x"}},
		{{Key: "_id", Value: 4}, {Key: "s", Value: "b"}, {Key: "k", Value: "x"}}, // other s
	}
	for _, d := range docs {
		if _, err := coll.InsertOne(t.Context(), d); err != nil {
			t.Fatalf("insert %v: %v", d, err)
		}
	}
	_, err := coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: 5}, {Key: "s", Value: "a"}, {Key: "k", Value: "x"}})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("insert of a taken (s, k): %v, want a duplicate key error", err)
	}

	for name, m := range map[string]mongo.IndexModel{
		"other filter": {Keys: bson.D{{Key: "k", Value: 1}},
			Options: options.Index().SetUnique(true).SetName("k_gt").SetPartialFilterExpression(bson.D{{Key: "k", Value: bson.D{{Key: "$gt", Value: 1}}}})},
		"field not in the key": {Keys: bson.D{{Key: "s", Value: 1}},
			Options: options.Index().SetUnique(true).SetName("s_if_k").SetPartialFilterExpression(exists("k"))},
		"not unique": {Keys: bson.D{{Key: "at", Value: 1}},
			Options: options.Index().SetName("at_unpublished").SetPartialFilterExpression(bson.D{{Key: "published", Value: false}})},
	} {
		_, err := coll.Indexes().CreateOne(t.Context(), m)
		var ce mongo.CommandError
		if !errors.As(err, &ce) || !strings.Contains(ce.Message, "partialFilterExpression") {
			t.Errorf("%s: %v, want FerretDB's refusal of partialFilterExpression", name, err)
		}
	}
}

// TestCloseDropsRequestsInFlight runs the funnel against an upstream that
// reads requests and never answers, as a store stuck on a long scan or a
// locked file: close must still return, and each client in flight (one
// write, one read, one write waiting for the slot) must see its
// connection dropped, as when a server dies.
func TestCloseDropsRequestsInFlight(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	got := make(chan struct{}, 8)
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					if _, err := readMessage(c); err != nil {
						return
					}
					got <- struct{}{}
				}
			}()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFunnel(ln, up.Addr().String(), newIDIndex(t.TempDir()), slog.New(slog.DiscardHandler))
	go f.serve()

	insert := opMsgOf(t, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "d"}}, "documents", bson.D{{Key: "_id", Value: 1}})
	find := opMsgOf(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}}, "")
	answers := make(chan error, 3)
	for _, req := range [][]byte{insert, find, insert} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := readMessage(c)
			answers <- err
		}()
	}
	// The first insert holds the slot upstream, the find is upstream on
	// its own connection, and the second insert waits for the slot.
	<-got
	<-got
	for buf := make([]byte, 1<<20); !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("(*writeSlot).acquire")); {
		runtime.Gosched()
	}

	closed := make(chan struct{})
	go func() {
		f.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second): // a deadlock detector, not a timing
		t.Fatal("close waits for requests the upstream never answers")
	}
	for range 3 {
		if err := <-answers; err == nil {
			t.Error("a client in flight got an answer; want its connection dropped")
		}
	}
}

// TestUnorderedInsertAnswersAsMongoDB: an unordered insert of several
// documents with duplicates among them gets MongoDB's answer ("Unordered
// Inserts" of the insertMany manual page, and the insert command's reply):
// every document is attempted, each duplicate, on _id or on another unique
// index, against a stored document or an earlier one of the same insert,
// is a write error at its own index, and n counts the others, which are
// all stored. The event store's group commit relies on it to give each
// command its own outcome. 250 documents span three of FerretDB's insert
// batches of 100, each written in one SQLite transaction.
func TestUnorderedInsertAnswersAsMongoDB(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	db := c.Database("funnel")
	coll := db.Collection(LogCollection)
	ctx := t.Context()
	if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "s", Value: 1}, {Key: "v", Value: 1}},
		Options: options.Index().SetUnique(true)}); err != nil {
		t.Fatal(err)
	}
	doc := func(id string, s string, v int) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "s", Value: s}, {Key: "v", Value: v}}
	}
	if _, err := coll.InsertMany(ctx, []any{doc("taken", "t", 0), doc("other", "s", 1)}); err != nil {
		t.Fatal(err)
	}
	const n = 250
	docs := make([]any, n)
	want := map[int]bool{} // indexes of the duplicates
	for i := range docs {
		docs[i] = doc(fmt.Sprintf("d%03d", i), "s", 100+i)
		switch i {
		case 3, 150: // a stored _id
			docs[i] = doc("taken", "s", 100+i)
		case 4, 240: // a stored (s, v)
			docs[i] = doc(fmt.Sprintf("d%03d", i), "s", 1)
		case 5, 201: // the _id of an earlier document of this insert
			docs[i] = doc(fmt.Sprintf("d%03d", i-5), "s", 100+i)
		case 6, 120: // the (s, v) of an earlier document of this insert
			docs[i] = doc(fmt.Sprintf("d%03d", i), "s", 100+i-5)
		default:
			continue
		}
		want[i] = true
	}

	// The command's own reply: n and writeErrors at their indexes.
	reply, err := db.RunCommand(ctx, bson.D{{Key: "insert", Value: LogCollection}, {Key: "documents", Value: docs},
		{Key: "ordered", Value: false}}).Raw()
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("insert: %v", err)
	}
	if got, _ := reply.Lookup("n").AsInt64OK(); got != int64(n-len(want)) {
		t.Errorf("n = %d, want %d", got, n-len(want))
	}
	var got []int
	errs, _ := reply.Lookup("writeErrors").ArrayOK()
	vals, _ := errs.Values()
	for _, v := range vals {
		we, _ := v.DocumentOK()
		i, _ := we.Lookup("index").AsInt64OK()
		code, _ := we.Lookup("code").AsInt64OK()
		if code != 11000 {
			t.Errorf("write error at %d: code %d, want 11000", i, code)
		}
		got = append(got, int(i))
	}
	wantIdx := slices.Sorted(maps.Keys(want))
	if !slices.Equal(got, wantIdx) {
		t.Errorf("write errors at %v, want %v", got, wantIdx)
	}
	for i, d := range docs {
		if want[i] {
			continue
		}
		var stored bson.D
		id := d.(bson.D)[0].Value
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&stored); err != nil {
			t.Errorf("document %d (%v): %v, want it stored", i, id, err)
		}
	}
	if total, err := coll.CountDocuments(ctx, bson.D{}); err != nil || total != int64(2+n-len(want)) {
		t.Errorf("%d documents stored (%v), want %d", total, err, 2+n-len(want))
	}

	// The driver's view, as the event store sees it: a BulkWriteException
	// whose write errors carry the same indexes.
	if _, err := coll.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$nin", Value: bson.A{"taken", "other"}}}}}); err != nil {
		t.Fatal(err)
	}
	_, err = coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		t.Fatalf("insertMany: %v, want a bulk write exception", err)
	}
	got = got[:0]
	for _, we := range bwe.WriteErrors {
		got = append(got, we.Index)
	}
	slices.Sort(got)
	if !slices.Equal(got, wantIdx) {
		t.Errorf("insertMany: write errors at %v, want %v", got, wantIdx)
	}
}

// TestUnacknowledgedWritesKeepAnswersInStep: an unacknowledged write
// (moreToCome: no answer wanted) leaves no answer behind for the next
// request on the funnel's connections. FerretDB 1.24 answers it anyway;
// left unread, every later write got the answer of the one before it,
// here an insert of a taken _id the answer ok of the unacknowledged
// insert before it. Both kinds of write are sent: inserts and updates.
func TestUnacknowledgedWritesKeepAnswersInStep(t *testing.T) {
	_, c := startStore(t, t.TempDir())
	ctx := t.Context()
	coll := c.Database("funnel").Collection("unacked")
	unacked := c.Database("funnel").Collection("unacked", options.Collection().SetWriteConcern(writeconcern.Unacknowledged()))
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "taken"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := unacked.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprint("i", i)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := unacked.UpdateOne(ctx, bson.D{{Key: "_id", Value: "taken"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: i}}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "taken"}}); !mongo.IsDuplicateKeyError(err) {
			t.Fatalf("round %d: an insert of a taken _id answered %v, want a duplicate key error", i, err)
		}
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: "taken"}})
		if err != nil || n != 1 {
			t.Fatalf("round %d: count of the taken _id %d, %v; want 1", i, n, err)
		}
	}
}

// TestChangeStreamAfterAWriteWhoseAnswerWasLost: the funnel's connection
// to FerretDB breaks after an insert reached it and before its answer came
// back. The insert is stored, but the funnel cannot know it: the next
// insert must not be cached at the row the lost one took, or a stream
// reports the next document twice and the lost one never.
func TestChangeStreamAfterAWriteWhoseAnswerWasLost(t *testing.T) {
	p := &cuttingProxy{cut: []byte("lost-answer"), cutDone: make(chan struct{})}
	c := startStoreThrough(t, t.TempDir(), p.start(t))
	ctx := t.Context()
	coll := c.Database("cs").Collection(LogCollection)
	start := startToken(t, coll)
	a, lost, next := doc("a", 1), doc("lost-answer", 2), doc("next", 3)
	if _, err := coll.InsertOne(ctx, a); err != nil {
		t.Fatal(err)
	}
	_, _ = coll.InsertOne(ctx, lost) // its answer is lost: a network error, or a duplicate key on a retry
	select {
	case <-p.cutDone:
	case <-time.After(within): // a deadlock detector, not a timing
		t.Fatal("the proxy never cut the insert's answer")
	}
	if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: "lost-answer"}}); err != nil || n != 1 {
		t.Fatalf("the insert whose answer was lost: %d stored, %v; want 1", n, err)
	}
	if _, err := coll.InsertOne(ctx, next); err != nil {
		t.Fatal(err)
	}
	cs := resumeFrom(t, coll, start)
	want := map[string]bson.Raw{"a": marshal(t, a), "lost-answer": marshal(t, lost), "next": marshal(t, next)}
	if got := nextIDs(t, cs, 3, want); fmt.Sprint(got) != "[a lost-answer next]" {
		t.Fatalf("events %v, want [a lost-answer next]", got)
	}
}

// startStoreThrough starts FerretDB on SQLite in dir and a funnel in front
// of it that reaches it at via(FerretDB's address), and returns a client
// of the funnel; all are stopped when the test ends.
func startStoreThrough(t *testing.T, dir string, via func(upstream string) string) *mongo.Client {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	fdb, err := ferretdb.New(&ferretdb.Config{Listener: ferretdb.ListenerConfig{TCP: "127.0.0.1:0"}, Handler: "sqlite",
		SQLiteURL: "file:" + dir + "/", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = fdb.Run(ctx)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	index := newIDIndex(dir)
	f := newFunnel(ln, via(strings.TrimSuffix(strings.TrimPrefix(fdb.MongoDBURI(), "mongodb://"), "/")), index, log)
	go f.serve()
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + ln.Addr().String() + "/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Disconnect(context.Background())
		f.close()
		cancel()
		<-done
		index.forget("", "")
	})
	return c
}

// cuttingProxy forwards TCP connections to an upstream. The connection
// that carries the first request holding cut is closed, both ways, once
// the upstream has answered that request, the answer not forwarded; then
// cutDone is closed.
type cuttingProxy struct {
	cut     []byte
	cutDone chan struct{}
	once    sync.Once
}

// start listens on loopback and returns the function that, given the
// upstream's address, returns the proxy's; it stops when the test ends.
func (p *cuttingProxy) start(t *testing.T) func(upstream string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return func(upstream string) string {
		go func() {
			for {
				down, err := ln.Accept()
				if err != nil {
					return
				}
				up, err := net.Dial("tcp", upstream)
				if err != nil {
					_ = down.Close()
					continue
				}
				go p.forward(down, up)
			}
		}()
		return ln.Addr().String()
	}
}

// forward passes whole wire messages between down and up until either
// closes, or until the answer to the request holding p.cut.
func (p *cuttingProxy) forward(down, up net.Conn) {
	defer down.Close()
	defer up.Close()
	var cutNext atomic.Bool
	go func() {
		defer up.Close()
		for {
			req, err := readMessage(down)
			if err != nil {
				return
			}
			if bytes.Contains(req, p.cut) {
				p.once.Do(func() { cutNext.Store(true) })
			}
			if _, err := up.Write(req); err != nil {
				return
			}
		}
	}()
	for {
		answer, err := readMessage(up)
		if err != nil {
			return
		}
		if cutNext.Load() {
			close(p.cutDone)
			return
		}
		if _, err := down.Write(answer); err != nil {
			return
		}
	}
}
