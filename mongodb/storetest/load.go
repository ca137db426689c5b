package storetest

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

func testLoadFrom(t *testing.T, s store) {
	stream := Unique("order-")
	var all []domain.Event
	for _, c := range []domain.Commit{
		NewCommit(stream, 0, placed("cust-4"), domain.OrderApproved{}, domain.OrderInvoiced{}),
		NewCommit(stream, 3, domain.OrderProcessingStarted{}),
		NewCommit(stream, 4, domain.OrderShipped{}, domain.OrderDelivered{}),
	} {
		all = append(all, appendRecorded(t, s, c)...)
	}
	// Another stream interleaved must not leak in.
	mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}, domain.OrderShipped{}))
	for from := int64(1); from <= 8; from++ {
		got, err := s.LoadFrom(t.Context(), stream, from)
		if err != nil {
			t.Fatalf("load from v%d: %v", from, err)
		}
		want := all[min(from-1, int64(len(all))):]
		if d := DiffEvents(want, got); d != "" {
			t.Errorf("load from v%d: %s", from, d)
		}
	}
}

func testLoadUnknown(t *testing.T, s store) {
	mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}))
	for _, from := range []int64{1, 5} {
		evs, err := s.LoadFrom(t.Context(), Unique("missing-"), from)
		if err != nil || len(evs) != 0 {
			t.Errorf("load unknown stream from v%d: %d events, %v; want none, no error", from, len(evs), err)
		}
	}
	if evs := mustLoad(t, s, Unique("missing-")); len(evs) != 0 {
		t.Errorf("load unknown stream: %d events", len(evs))
	}
}

// testUnreadableCommit puts in the log, raw, what this build cannot read:
// an event type it does not know (as a newer writer stores it), a commit
// that does not continue its stream's versions, and a document that is
// not a commit. Reading those streams fails with ErrUnreadableCommit, not
// ErrUnavailable (readers would retry it for ever); a scan hands each of
// them over with that error and the events before it, and goes on.
func testUnreadableCommit(t *testing.T, s store) {
	ctx := t.Context()
	commits := s.db.Collection(mongodb.CommitsCollection)
	at := time.Date(2025, 2, 3, 4, 5, 6, 0, time.UTC)
	// raw is a commit document stored under id, as another writer stores it.
	raw := func(id, stream string, first, last int64, events any) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "stream_id", Value: stream},
			{Key: "stream_type", Value: domain.StreamTypeOrder}, {Key: "first_version", Value: first}, {Key: "last_version", Value: last},
			{Key: "events", Value: events}, {Key: "recorded_at", Value: at}, {Key: "published", Value: true}}
	}
	newer, chain, garbled, fine := Unique("newer-"), Unique("chain-"), Unique("garbled-"), Unique("fine-")
	var heads []domain.Event
	for _, stream := range []string{newer, chain, garbled, fine} {
		c := NewCommit(stream, 0, placed("cust-u"))
		heads = append(heads, appendRecorded(t, s, c)...)
	}
	for _, d := range []bson.D{
		raw(mongodb.CommitID(newer, 2), newer, 2, 2, bson.A{bson.D{{Key: "event_id", Value: "e-refund"}, {Key: "type", Value: "OrderRefunded"},
			{Key: "version", Value: int64(2)}, {Key: "occurred_at", Value: at}, {Key: "recorded_at", Value: at},
			{Key: "data", Value: bson.D{{Key: "amount_cents", Value: int64(100)}}}, {Key: "schema_version", Value: 1}}}),
		// Where the commit starting at v2 belongs, one holding v3.
		raw(mongodb.CommitID(chain, 2), chain, 3, 3, bson.A{}),
		raw(mongodb.CommitID(garbled, 2), garbled, 2, 2, "not a list of events"),
	} {
		if _, err := commits.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, stream := range []string{newer, chain, garbled} {
		for _, from := range []int64{1, 2} {
			_, err := s.LoadFrom(ctx, stream, from)
			if !errors.Is(err, domain.ErrUnreadableCommit) || errors.Is(err, domain.ErrUnavailable) {
				t.Errorf("load %s from v%d: %v, want ErrUnreadableCommit", stream, from, err)
			}
		}
	}
	if _, err := s.Load(ctx, newer, 0); !errors.Is(err, domain.ErrUnknownEvent) {
		t.Errorf("load %s: %v, want it to wrap ErrUnknownEvent too", newer, err)
	}
	got := map[string]domain.StreamEvents{}
	if err := s.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
		got[st.StreamID] = st
		return nil
	}); err != nil {
		t.Fatalf("scan over unreadable commits: %v", err)
	}
	for i, stream := range []string{newer, chain, garbled, fine} {
		st := got[stream]
		if d := DiffEvents(heads[i:i+1], st.Events); d != "" {
			t.Errorf("scan %s: %s", stream, d)
		}
		// A scan reads commits by id, not along the chain: the stray
		// commit holds no event to decode.
		if unreadable := stream == newer || stream == garbled; unreadable != errors.Is(st.Err, domain.ErrUnreadableCommit) {
			t.Errorf("scan %s: error %v", stream, st.Err)
		}
	}
}
