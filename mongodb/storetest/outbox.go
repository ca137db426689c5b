package storetest

import (
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// testRecordedSince checks the relay's catch-up read: the commits recorded
// since a time, oldest first, as Load decodes them, in batches of the size
// asked; none after the newest.
func testRecordedSince(t *testing.T, s store) {
	ctx := t.Context()
	a, b := Unique("order-"), Unique("order-")
	commits := []domain.Commit{
		NewCommit(a, 0, domain.OrderApproved{}, domain.OrderInvoiced{}),
		NewCommit(b, 0, domain.OrderApproved{}),
		NewCommit(a, 2, domain.OrderShipped{}),
	}
	ids := make([]string, len(commits))
	var first, last time.Time
	for i, c := range commits {
		at := mustAppend(t, s, c)
		if i == 0 {
			first = at
		}
		last = at
		ids[i] = mongodb.CommitID(c.StreamID, c.ExpectedVersion+1)
	}

	var got []domain.RecordedCommit
	batches := 0
	if err := s.RecordedSince(ctx, first, 2, func(cs []domain.RecordedCommit) error {
		if len(cs) > 2 {
			t.Errorf("a batch of %d commits, asked for 2", len(cs))
		}
		batches++
		got = append(got, cs...)
		return nil
	}); err != nil {
		t.Fatalf("recorded since: %v", err)
	}
	var gotIDs []string
	for i, c := range got {
		gotIDs = append(gotIDs, c.ID)
		if c.Err != nil {
			t.Fatalf("commit %s: %v", c.ID, c.Err)
		}
		if i > 0 && c.RecordedAt.Before(got[i-1].RecordedAt) {
			t.Errorf("commit %s recorded at %v, before the one ahead of it (%v)", c.ID, c.RecordedAt, got[i-1].RecordedAt)
		}
		loaded, err := s.Load(ctx, c.StreamID, 0)
		if err != nil {
			t.Fatalf("load %s: %v", c.StreamID, err)
		}
		// What the relay publishes reads back, on the bus's other side, as
		// the events Load gives.
		events := make([]domain.Event, len(c.Events))
		for k, m := range c.Events {
			if events[k], err = domain.UnmarshalEvent(m.Body); err != nil || events[k].ID != m.ID {
				t.Fatalf("commit %s: event %s's message: %v, id %s", c.ID, m.ID, err, events[k].ID)
			}
		}
		at := slices.IndexFunc(loaded, func(e domain.Event) bool { return len(events) > 0 && e.ID == events[0].ID })
		if at < 0 || at+len(events) > len(loaded) {
			t.Fatalf("commit %s: its events are not in the stream", c.ID)
		}
		if d := DiffEvents(loaded[at:at+len(events)], events); d != "" {
			t.Errorf("commit %s differs from Load: %s", c.ID, d)
		}
		if c.FirstVersion != events[0].Version || c.CorrelationID != events[0].Metadata.CorrelationID {
			t.Errorf("commit %s: first version %d, correlation id %q; its first event's are %d, %q", c.ID,
				c.FirstVersion, c.CorrelationID, events[0].Version, events[0].Metadata.CorrelationID)
		}
	}
	if !slices.Equal(gotIDs, ids) {
		t.Fatalf("recorded since the first: %v, want the 3 commits in order %v", gotIDs, ids)
	}
	if batches != 2 {
		t.Errorf("%d batches of 3 commits at 2 a batch, want 2", batches)
	}
	var none int
	if err := s.RecordedSince(ctx, last.Add(time.Millisecond), 10, func(cs []domain.RecordedCommit) error {
		none += len(cs)
		return nil
	}); err != nil || none != 0 {
		t.Fatalf("recorded after the last commit: %d commits, %v", none, err)
	}
}

// testOldestUnpublished checks where the first relay on a log starts: at
// the oldest commit that an earlier version did not mark published, which
// every commit of this version is.
func testOldestUnpublished(t *testing.T, s store) {
	ctx := t.Context()
	if _, found, err := s.OldestUnpublished(ctx); err != nil || found {
		t.Fatalf("on an empty log: found %v, %v", found, err)
	}
	coll := s.db.Collection(mongodb.CommitsCollection)
	old := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
	// A commit an earlier version appended and published, and one it left
	// unpublished.
	for i, published := range []bool{true, false} {
		stream := Unique("order-")
		doc := bson.D{{Key: "_id", Value: mongodb.CommitID(stream, 1)}, {Key: "stream_id", Value: stream},
			{Key: "first_version", Value: int64(1)}, {Key: "last_version", Value: int64(1)},
			{Key: "recorded_at", Value: old.Add(time.Duration(i) * time.Minute)}, {Key: "published", Value: published}}
		if _, err := coll.InsertOne(ctx, doc); err != nil {
			t.Fatalf("insert an earlier version's commit: %v", err)
		}
	}
	at, found, err := s.OldestUnpublished(ctx)
	if err != nil || !found || !at.Equal(old.Add(time.Minute)) {
		t.Fatalf("oldest unpublished: %v, %v, %v; want the unmarked commit's %v", at, found, err, old.Add(time.Minute))
	}
}
