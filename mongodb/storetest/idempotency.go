package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
)

func testIdempotencyKey(t *testing.T, s store) {
	stream, other := Unique("order-"), Unique("order-")
	key := Unique("key-")
	c0 := NewCommit(stream, 0, placed("cust-2"))
	want := appendRecorded(t, s, c0)
	first := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{})
	first.IdempotencyKey, first.RequestHash = key, "sha256:first"
	want = append(want, appendRecorded(t, s, first)...)
	mustAppend(t, s, NewCommit(other, 0, placed("cust-3")))

	// The retry of the same request and the same key on the stream's next
	// version: both refused, neither stored.
	retry := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{})
	next := NewCommit(stream, 3, domain.OrderShipped{})
	for name, c := range map[string]domain.Commit{"retry": retry, "next version": next} {
		c.IdempotencyKey, c.RequestHash = key, "sha256:"+name
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrDuplicateRequest) {
			t.Errorf("%s with a used key: %v, want ErrDuplicateRequest", name, err)
		}
		if evs := mustLoad(t, s, c.StreamID); int64(len(evs)) > c.ExpectedVersion && evs[c.ExpectedVersion].ID == c.Events[0].ID {
			t.Errorf("%s with a used key stored its events", name)
		}
	}
	wantEvents(t, s, stream, want)
	wantCommits(t, s, bson.D{}, 3)

	// The key is found in its stream, and only there.
	got, err := s.FindIdempotencyKey(t.Context(), key, stream)
	if err != nil {
		t.Fatalf("find key: %v", err)
	}
	if got.StreamID != stream || got.StreamType != domain.StreamTypeOrder || got.ExpectedVersion != 1 ||
		got.LastVersion() != 3 || got.IdempotencyKey != key || got.RequestHash != "sha256:first" {
		t.Errorf("find key: stream %s/%s v%d..v%d key %q hash %q; want %s/%s v1..v3 key %q hash %q",
			got.StreamType, got.StreamID, got.ExpectedVersion, got.LastVersion(), got.IdempotencyKey, got.RequestHash,
			domain.StreamTypeOrder, stream, key, "sha256:first")
	}
	if d := DiffEvents(want[1:], got.Events); d != "" {
		t.Errorf("find key events: %s", d)
	}
	for _, elsewhere := range []string{"", other, Unique("missing-"), "a.b"} {
		if got, err := s.FindIdempotencyKey(t.Context(), key, elsewhere); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("find key in stream %q: %s, %v; want ErrNotFound", elsewhere, got.StreamID, err)
		}
	}
}

// testKeyPerStream: an idempotency key is unique within its stream, not
// across the log (a collection sharded by stream_id cannot enforce more);
// commits of other streams with the same key, also racing, are stored.
func testKeyPerStream(t *testing.T, s store) {
	const streams = 8
	key := Unique("key-")
	ids := make([]string, streams)
	for i := range ids {
		ids[i] = Unique("order-")
	}
	commits := keyedCommits(key, ids)
	_, errs := appendAtOnce(t, s, commits)
	for i, c := range commits {
		if errs[i] != nil {
			t.Errorf("stream %d with a key used on other streams: %v, want stored", i, errs[i])
			continue
		}
		got, err := s.FindIdempotencyKey(t.Context(), key, c.StreamID)
		if err != nil || got.StreamID != c.StreamID || got.RequestHash != c.RequestHash {
			t.Errorf("find key in stream %d: %s %q, %v; want %s %q", i, got.StreamID, got.RequestHash, err, c.StreamID, c.RequestHash)
		}
	}
	// Within each stream the key stays taken.
	again := NewCommit(commits[0].StreamID, 1, domain.OrderApproved{})
	again.IdempotencyKey, again.RequestHash = key, "hash-again"
	if _, err := s.Append(t.Context(), again); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Errorf("the key again in its stream: %v, want ErrDuplicateRequest", err)
	}
	wantCommits(t, s, bson.D{}, streams)
}

// testKeylessCommits: commits without an idempotency key are never
// compared by the key index, within one stream or across streams.
func testKeylessCommits(t *testing.T, s store) {
	stream := Unique("order-")
	keyed := NewCommit(stream, 0, placed("cust-1"))
	keyed.IdempotencyKey, keyed.RequestHash = Unique("key-"), "hash"
	mustAppend(t, s, keyed)
	for v := int64(1); v <= 4; v++ {
		mustAppend(t, s, NewCommit(stream, v, domain.OrderApproved{}))
	}
	for i := range 3 {
		mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}))
		mustAppend(t, s, NewCommit(stream, 5+int64(i), domain.OrderApproved{}))
	}
	if evs := mustLoad(t, s, stream); len(evs) != 8 {
		t.Errorf("stream has %d events, want 8", len(evs))
	}
	// Without a key the commit document has no idempotency_key field.
	wantCommits(t, s, bson.D{{Key: "stream_id", Value: stream}, {Key: "idempotency_key", Value: bson.D{{Key: "$exists", Value: false}}}}, 7)
}

func testUnknownKey(t *testing.T, s store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, domain.OrderApproved{})
	c.IdempotencyKey = Unique("key-")
	mustAppend(t, s, c)
	mustAppend(t, s, NewCommit(stream, 1, domain.OrderShipped{}))
	for _, hint := range []string{"", stream, Unique("missing-")} {
		if _, err := s.FindIdempotencyKey(t.Context(), Unique("key-"), hint); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("find an unknown key (stream %q): %v, want ErrNotFound", hint, err)
		}
	}
	if _, err := s.FindIdempotencyKey(t.Context(), "", ""); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("find the empty key: %v, want ErrNotFound", err)
	}
}

// testRaceSameKey: racing retries of one request (one stream, one
// version, one key): one is stored, every other one is told the key is
// stored, not that the version moved on.
func testRaceSameKey(t *testing.T, s store) {
	const racers = 16
	key, stream := Unique("key-"), Unique("order-")
	commits := keyedCommits(key, slices.Repeat([]string{stream}, racers))
	_, errs := appendAtOnce(t, s, commits)
	winner, _ := oneWinner(t, "key "+key, errs, domain.ErrDuplicateRequest)
	got, err := s.FindIdempotencyKey(t.Context(), key, stream)
	if err != nil || got.StreamID != commits[winner].StreamID || got.RequestHash != commits[winner].RequestHash {
		t.Errorf("find key: %s %q, %v; want the winner's %s %q", got.StreamID, got.RequestHash, err,
			commits[winner].StreamID, commits[winner].RequestHash)
	}
	wantCommits(t, s, bson.D{}, 1)
}

// keyedCommits returns a commit per stream, each placing an order of its
// own under key with a request hash of its own ("hash-<i>").
func keyedCommits(key string, streams []string) []domain.Commit {
	commits := make([]domain.Commit, len(streams))
	for i, stream := range streams {
		commits[i] = NewCommit(stream, 0, placed(fmt.Sprintf("cust-%d", i)))
		commits[i].IdempotencyKey, commits[i].RequestHash = key, fmt.Sprintf("hash-%d", i)
	}
	return commits
}
