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

// testImmutable checks invariant 2: a commit never changes after its
// insert. Refused appends (a stale version, a reused key), a later commit
// of the stream and every read the relay makes (its change stream, its
// catch-up) leave each stored commit byte for byte as it was inserted,
// with no outbox marker.
func testImmutable(t *testing.T, s store) {
	ctx := t.Context()
	coll := s.db.Collection(mongodb.CommitsCollection)
	stream := Unique("order-")
	c1 := NewCommit(stream, 0, placed("cust-7"), domain.OrderApproved{})
	c1.IdempotencyKey, c1.RequestHash = Unique("key-"), "hash-1"
	from := mustAppend(t, s, c1)
	mustAppend(t, s, NewCommit(stream, 2, domain.OrderShipped{}, domain.OrderCanceled{Reason: "recalled"}))
	before := rawCommits(t, coll, stream)
	if len(before) != 2 {
		t.Fatalf("%d raw commits, want 2", len(before))
	}
	for i, d := range before {
		for _, marker := range []string{"published", "published_at"} {
			if _, err := d.LookupErr(marker); err == nil {
				t.Errorf("commit %d holds an outbox marker %q: %s", i, marker, d)
			}
		}
	}

	if _, err := s.Append(ctx, NewCommit(stream, 2, domain.OrderDelivered{})); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("stale append: %v", err)
	}
	dup := NewCommit(stream, 4, domain.OrderDelivered{})
	dup.IdempotencyKey = c1.IdempotencyKey
	if _, err := s.Append(ctx, dup); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Fatalf("duplicate key: %v", err)
	}
	mustAppend(t, s, NewCommit(stream, 4, domain.OrderDelivered{}))
	// The relay's reads: the change stream and the catch-up.
	var read int
	if err := s.RecordedSince(ctx, from.Add(-time.Second), 10, func(cs []domain.RecordedCommit) error {
		read += len(cs)
		return nil
	}); err != nil {
		t.Fatalf("read the log since the first commit: %v", err)
	}
	if read < 3 {
		t.Fatalf("the catch-up read %d commits, want at least the stream's 3", read)
	}
	opened := errors.New("opened")
	if err := s.Tail(ctx, nil, 10, func([]domain.RecordedCommit, []byte) error { return opened }); !errors.Is(err, opened) {
		t.Fatalf("tail the log: %v", err)
	}

	after := rawCommits(t, coll, stream)
	if len(after) != 3 {
		t.Fatalf("%d raw commits, want 3", len(after))
	}
	for i, d := range before {
		if !bytes.Equal(d, after[i]) {
			t.Errorf("commit %d changed after its insert:\nwas %s\nis  %s", i, d, after[i])
		}
	}
}
