package embedded

import (
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func exists(field string) bson.D {
	return bson.D{{Key: field, Value: bson.D{{Key: "$exists", Value: true}}}}
}

// TestUniqueIndexOverPresentFields: a unique index with the partial filter
// {f: {$exists: true}} is created (FerretDB refuses partial indexes) and
// keeps MongoDB's meaning: documents without f are never compared, those
// with f are unique on the whole key. A non-unique partial index is
// created whole (it answers the same queries). Other partial filters of
// unique indexes are refused, not silently widened.
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
	} {
		_, err := coll.Indexes().CreateOne(t.Context(), m)
		var ce mongo.CommandError
		if !errors.As(err, &ce) || !strings.Contains(ce.Message, "partialFilterExpression") {
			t.Errorf("%s: %v, want FerretDB's refusal of partialFilterExpression", name, err)
		}
	}
	unpublished := mongo.IndexModel{Keys: bson.D{{Key: "at", Value: 1}},
		Options: options.Index().SetName("at_unpublished").SetPartialFilterExpression(bson.D{{Key: "published", Value: false}})}
	for i := range 2 {
		if _, err := coll.Indexes().CreateOne(t.Context(), unpublished); err != nil {
			t.Fatalf("create a non-unique partial index (%d): %v", i+1, err)
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
	f := newFunnel(ln, up.Addr().String(), nil, slog.New(slog.DiscardHandler))
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
	for queued := false; !queued; {
		runtime.Gosched()
		f.slot.mu.Lock()
		queued = waiters(&f.slot) == 1
		f.slot.mu.Unlock()
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
