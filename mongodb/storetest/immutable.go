package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// rawCommits returns the stream's raw commit documents in version order.
func rawCommits(t *testing.T, coll *mongo.Collection, stream string) []bson.Raw {
	t.Helper()
	cur, err := coll.Find(t.Context(), inStream(stream),
		options.Find().SetSort(bson.D{{Key: "first_version", Value: 1}}))
	if err != nil {
		t.Fatalf("read raw commits: %v", err)
	}
	var docs []bson.Raw
	if err := cur.All(t.Context(), &docs); err != nil {
		t.Fatalf("read raw commits: %v", err)
	}
	return docs
}

// immutablePart returns the elements of a commit document other than the
// outbox marker, in stored order.
func immutablePart(t *testing.T, doc bson.Raw) []bson.RawElement {
	t.Helper()
	els, err := doc.Elements()
	if err != nil {
		t.Fatalf("raw commit: %v", err)
	}
	var out []bson.RawElement
	for _, e := range els {
		if k := e.Key(); k != "published" && k != "published_at" {
			out = append(out, e)
		}
	}
	return out
}

func testImmutable(t *testing.T, s *mongodb.EventStore) {
	ctx := t.Context()
	coll := databaseOf(t, s).Collection(mongodb.CommitsCollection)
	stream := Unique("order-")
	c1 := NewCommit(stream, 0, placed("cust-7"), domain.OrderApproved{})
	c1.IdempotencyKey, c1.RequestHash = Unique("key-"), "hash-1"
	mustAppend(t, s, c1)
	mustAppend(t, s, NewCommit(stream, 2, domain.OrderShipped{}, domain.OrderCanceled{Reason: "recalled"}))
	before := rawCommits(t, coll, stream)
	if len(before) != 2 {
		t.Fatalf("%d raw commits, want 2", len(before))
	}
	for i, d := range before {
		if pub, ok := d.Lookup("published").BooleanOK(); !ok || pub {
			t.Fatalf("commit %d: published = %v before any marker", i, d.Lookup("published"))
		}
		if _, err := d.LookupErr("published_at"); err == nil {
			t.Fatalf("commit %d has published_at before any marker", i)
		}
	}

	// Refused appends, a later commit and the outbox markers must leave
	// the stored commits as they were.
	if _, err := s.Append(ctx, NewCommit(stream, 2, domain.OrderDelivered{})); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("stale append: %v", err)
	}
	dup := NewCommit(stream, 4, domain.OrderDelivered{})
	dup.IdempotencyKey = c1.IdempotencyKey
	if _, err := s.Append(ctx, dup); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Fatalf("duplicate key: %v", err)
	}
	mustAppend(t, s, NewCommit(stream, 4, domain.OrderDelivered{}))

	markedFrom := domain.Timestamp(time.Now())
	for i := 0; ; i++ {
		pending, err := s.Pending(ctx, time.Time{}, 1000)
		if err != nil {
			t.Fatalf("read outbox: %v", err)
		}
		var ids []string
		for _, c := range pending {
			if c.StreamID == stream {
				ids = append(ids, c.ID)
			}
		}
		if len(ids) == 0 {
			break
		}
		if i == 10 {
			t.Fatal("the outbox still holds the stream's commits after 10 rounds of markers")
		}
		if n, err := s.MarkPublished(ctx, ids); err != nil || n != len(ids) {
			t.Fatalf("mark %d commits published: %d marked, %v", len(ids), n, err)
		}
	}
	after := rawCommits(t, coll, stream)
	if len(after) != 3 {
		t.Fatalf("%d raw commits after publishing, want 3", len(after))
	}
	for i, d := range after {
		if pub, ok := d.Lookup("published").BooleanOK(); !ok || !pub {
			t.Errorf("commit %d: published = %v after the markers", i, d.Lookup("published"))
		}
		at, ok := d.Lookup("published_at").TimeOK()
		if !ok || at.Before(markedFrom) || at.After(time.Now()) {
			t.Errorf("commit %d: published_at = %v, want a date in the markers' run", i, d.Lookup("published_at"))
		}
	}
	for i, d := range before {
		was, is := immutablePart(t, d), immutablePart(t, after[i])
		if len(was) != len(is) {
			t.Errorf("commit %d: %d fields besides the marker, had %d:\nwas %s\nis  %s", i, len(is), len(was), d, after[i])
			continue
		}
		for j := range was {
			if !bytes.Equal(was[j], is[j]) {
				t.Errorf("commit %d field %q changed:\nwas %s\nis  %s", i, was[j].Key(), was[j].Value(), is[j].Value())
			}
		}
	}
}
