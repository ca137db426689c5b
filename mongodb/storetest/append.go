package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

func testAppendAndLoad(t *testing.T, s store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, placed("cust-1"), domain.OrderApproved{})
	before := time.Now()
	at := mustAppend(t, s, c)
	after := time.Now()
	if at != domain.Timestamp(at) {
		t.Errorf("recorded_at %v is not a domain.Timestamp", at)
	}
	if at.Before(domain.Timestamp(before)) || at.After(after) {
		t.Errorf("recorded_at %v is outside the append's [%v, %v]", at, before, after)
	}
	want := recorded(c, at)
	wantEvents(t, s, stream, want)

	c2 := NewCommit(stream, 2, domain.OrderInvoiced{}, domain.OrderShipped{}, domain.OrderCanceled{Reason: "recalled: ü ∑ \"quoted\""})
	at2 := mustAppend(t, s, c2)
	want = append(want, recorded(c2, at2)...)
	wantEvents(t, s, stream, want)
	// Load after a head the caller saw returns only what followed it.
	for _, after := range []int64{0, 2, 5} {
		got, err := s.Load(t.Context(), stream, after)
		if err != nil {
			t.Fatalf("load after v%d: %v", after, err)
		}
		if d := DiffEvents(want[after:], got); d != "" {
			t.Errorf("load after v%d: %s", after, d)
		}
	}
	for i, e := range mustLoad(t, s, stream) {
		if e.Version != int64(i)+1 {
			t.Fatalf("event %d has version %d", i, e.Version)
		}
	}
	wantCommits(t, s, inStream(stream), 2)
}

func testTimesNormalized(t *testing.T, s store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, domain.OrderApproved{})
	sp := time.FixedZone("BRT", -3*3600)
	raw := time.Date(2018, 3, 4, 5, 6, 7, 891_234_567, sp)
	c.Events[0].OccurredAt = raw
	at := mustAppend(t, s, c)
	evs := mustLoad(t, s, stream)
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	if got, want := evs[0].OccurredAt, domain.Timestamp(raw); !got.Equal(want) || got.Location() != time.UTC || got.Nanosecond() != 891_000_000 {
		t.Errorf("occurred_at %v, want %v (UTC, ms)", got, want)
	}
	if !evs[0].RecordedAt.Equal(at) {
		t.Errorf("recorded_at %v, want %v", evs[0].RecordedAt, at)
	}
}

func testStaleVersion(t *testing.T, s store) {
	stream := Unique("order-")
	c1 := NewCommit(stream, 0, placed("cust-1"), domain.OrderApproved{})
	c2 := NewCommit(stream, 2, domain.OrderShipped{})
	want := appendRecorded(t, s, c1)
	want = append(want, appendRecorded(t, s, c2)...)

	for _, expected := range []int64{0, 2} {
		c := NewCommit(stream, expected, domain.OrderCanceled{Reason: "stale"}, domain.OrderDelivered{})
		c.IdempotencyKey, c.RequestHash = Unique("key-"), "hash"
		_, err := s.Append(t.Context(), c)
		if !errors.Is(err, domain.ErrVersionConflict) {
			t.Fatalf("append at stale v%d: %v, want ErrVersionConflict", expected, err)
		}
		if _, err := s.FindIdempotencyKey(t.Context(), c.IdempotencyKey, stream); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("key of a refused append: %v, want ErrNotFound", err)
		}
	}
	wantEvents(t, s, stream, want)
	wantCommits(t, s, inStream(stream), 2)
}

func testMultiEventCommit(t *testing.T, s store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, placed("cust-9"), domain.OrderApproved{}, domain.OrderInvoiced{})
	want := appendRecorded(t, s, c)
	wantEvents(t, s, stream, want)

	// One document holds the whole commit: that is what makes it atomic.
	var doc struct {
		FirstVersion int64 `bson:"first_version"`
		LastVersion  int64 `bson:"last_version"`
		Events       []struct {
			ID      string `bson:"event_id"`
			Version int64  `bson:"version"`
		} `bson:"events"`
		Published bool `bson:"published"`
	}
	coll := s.db.Collection(mongodb.CommitsCollection)
	if err := coll.FindOne(t.Context(), inStream(stream)).Decode(&doc); err != nil {
		t.Fatalf("read commit: %v", err)
	}
	if doc.FirstVersion != 1 || doc.LastVersion != 3 || len(doc.Events) != 3 || doc.Published {
		t.Fatalf("commit document: first %d last %d, %d events, published %v; want 1, 3, 3, false",
			doc.FirstVersion, doc.LastVersion, len(doc.Events), doc.Published)
	}
	for i, e := range doc.Events {
		if e.ID != c.Events[i].ID || e.Version != int64(i)+1 {
			t.Errorf("stored event %d: %s v%d, want %s v%d", i, e.ID, e.Version, c.Events[i].ID, i+1)
		}
	}

	// A commit overlapping it, from any version inside it, stores nothing.
	bad := NewCommit(stream, 0, placed("cust-9"))
	if _, err := s.Append(t.Context(), bad); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("append over the commit: %v, want ErrVersionConflict", err)
	}
	wantEvents(t, s, stream, want)
}

// testUniqueIndexes: a collection sharded by stream_id can only have
// unique indexes that start with the shard key, so every unique index of
// the event collection does; the two that invariants 1 and 7 rely on are
// there.
func testUniqueIndexes(t *testing.T, s store) {
	coll := s.db.Collection(mongodb.CommitsCollection)
	mustAppend(t, s, NewCommit(Unique("order-"), 0, placed("cust-1")))
	cur, err := coll.Indexes().List(t.Context())
	if err != nil {
		t.Fatalf("list indexes: %v", err)
	}
	var specs []struct {
		Name   string `bson:"name"`
		Key    bson.D `bson:"key"`
		Unique bool   `bson:"unique"`
	}
	if err := cur.All(t.Context(), &specs); err != nil {
		t.Fatalf("read indexes: %v", err)
	}
	var unique []string
	for _, ix := range specs {
		if !ix.Unique || ix.Name == "_id_" {
			continue // _id is exempt from the shard-key rule
		}
		var fields []string
		for _, k := range ix.Key {
			fields = append(fields, k.Key)
		}
		unique = append(unique, strings.Join(fields, ","))
		if fields[0] != "stream_id" {
			t.Errorf("unique index %s on (%s) does not start with stream_id", ix.Name, strings.Join(fields, ", "))
		}
	}
	for _, want := range []string{"stream_id,first_version", "stream_id,idempotency_key"} {
		if !slices.Contains(unique, want) {
			t.Errorf("no unique index on (%s); unique indexes: %q", want, unique)
		}
	}
}

func testInvalidStreamID(t *testing.T, s store) {
	for _, id := range []string{"a.b", "$where", strings.Repeat("a", domain.MaxIDLength+1), "", "a b", "orders.>", "a*", "ü"} {
		c := NewCommit(id, 0, domain.OrderApproved{})
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrValidation) {
			t.Errorf("append to stream %q: %v, want ErrValidation", id, err)
		}
	}
	// The longest valid id is accepted.
	ok := strings.Repeat("z", domain.MaxIDLength)
	mustAppend(t, s, NewCommit(ok, 0, domain.OrderApproved{}))
	wantCommits(t, s, bson.D{}, 1) // only the valid one
}

func testMalformedCommit(t *testing.T, s store) {
	stream := Unique("order-")
	base := NewCommit(stream, 0, placed("cust-5"))
	want := appendRecorded(t, s, base)

	mk := func(edit func(c *domain.Commit)) domain.Commit {
		c := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderShipped{})
		edit(&c)
		return c
	}
	cases := map[string]domain.Commit{
		"no events":                mk(func(c *domain.Commit) { c.Events = nil }),
		"negative expected":        mk(func(c *domain.Commit) { c.ExpectedVersion = -1 }),
		"first version skips":      mk(func(c *domain.Commit) { c.ExpectedVersion = 2 }),
		"versions repeat":          mk(func(c *domain.Commit) { c.Events[2].Version = 3 }),
		"versions gap":             mk(func(c *domain.Commit) { c.Events[2].Version = 5 }),
		"versions descend":         mk(func(c *domain.Commit) { c.Events[0].Version, c.Events[1].Version = 3, 2 }),
		"type mismatches data":     mk(func(c *domain.Commit) { c.Events[2].Type = domain.TypeOrderDelivered }),
		"unknown type":             mk(func(c *domain.Commit) { c.Events[1].Type = "OrderTeleported" }),
		"nil data":                 mk(func(c *domain.Commit) { c.Events[0].Data = nil }),
		"event of another stream":  mk(func(c *domain.Commit) { c.Events[1].StreamID = Unique("order-") }),
		"event without id":         mk(func(c *domain.Commit) { c.Events[2].ID = "" }),
		"events of two commands":   mk(func(c *domain.Commit) { c.Events[1].Metadata.CorrelationID = "corr-other" }),
		"bad event among good":     mk(func(c *domain.Commit) { c.Events[2].Data = domain.OrderCanceled{} }),
		"bad key on a bad commit":  mk(func(c *domain.Commit) { c.Events = nil; c.IdempotencyKey = "k-bad" }),
		"invalid id with good key": mk(func(c *domain.Commit) { c.StreamID = "a.b"; c.IdempotencyKey = "k-bad2" }),
	}
	for name, c := range cases {
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrValidation) {
			t.Errorf("%s: %v, want ErrValidation", name, err)
		}
	}
	wantEvents(t, s, stream, want)
	wantCommits(t, s, bson.D{}, 1)
	for _, key := range []string{"k-bad", "k-bad2"} {
		if _, err := s.FindIdempotencyKey(t.Context(), key, stream); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("key %s of a refused commit: %v, want ErrNotFound", key, err)
		}
	}
}
