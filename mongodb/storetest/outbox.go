package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// testOutbox checks the outbox relay's reads and markers: Pending returns
// the unpublished commits oldest first, as Load decodes them, within its
// limit and before its time; MarkPublished takes commits out of it, and
// Unpublished counts what is left.
func testOutbox(t *testing.T, s *mongodb.EventStore) {
	ctx := t.Context()
	a, b := Unique("order-"), Unique("order-")
	commits := []domain.Commit{
		NewCommit(a, 0, domain.OrderApproved{}, domain.OrderInvoiced{}),
		NewCommit(b, 0, domain.OrderApproved{}),
		NewCommit(a, 2, domain.OrderShipped{}),
	}
	ids := make([]string, len(commits))
	var first time.Time
	for i, c := range commits {
		at := mustAppend(t, s, c)
		if i == 0 {
			first = at
		}
		ids[i] = mongodb.CommitID(c.StreamID, c.ExpectedVersion+1)
	}

	pending, err := s.Pending(ctx, time.Time{}, 10)
	if err != nil {
		t.Fatalf("pending: %v", err)
	}
	var got []string
	for i, c := range pending {
		got = append(got, c.ID)
		if c.Err != nil {
			t.Fatalf("pending commit %s: %v", c.ID, c.Err)
		}
		if i > 0 && c.RecordedAt.Before(pending[i-1].RecordedAt) {
			t.Errorf("pending commit %s recorded at %v, before the one ahead of it (%v)", c.ID, c.RecordedAt, pending[i-1].RecordedAt)
		}
		loaded, err := s.Load(ctx, c.StreamID, 0)
		if err != nil {
			t.Fatalf("load %s: %v", c.StreamID, err)
		}
		at := slices.IndexFunc(loaded, func(e domain.Event) bool { return len(c.Events) > 0 && e.ID == c.Events[0].ID })
		if at < 0 || at+len(c.Events) > len(loaded) {
			t.Fatalf("pending commit %s: its events are not in the stream", c.ID)
		}
		if d := DiffEvents(loaded[at:at+len(c.Events)], c.Events); d != "" {
			t.Errorf("pending commit %s differs from Load: %s", c.ID, d)
		}
	}
	if !sameSet(got, ids) {
		t.Fatalf("pending %v, want the 3 commits %v", got, ids)
	}
	if some, err := s.Pending(ctx, time.Time{}, 2); err != nil || len(some) != 2 {
		t.Fatalf("pending with limit 2: %d commits, %v", len(some), err)
	}
	if none, err := s.Pending(ctx, first, 10); err != nil || len(none) != 0 {
		t.Fatalf("pending before the first commit's recorded time: %d commits, %v", len(none), err)
	}

	if n, err := s.MarkPublished(ctx, ids[:2]); err != nil || n != 2 {
		t.Fatalf("mark 2 commits published: %d, %v", n, err)
	}
	left, err := s.Pending(ctx, time.Time{}, 10)
	if err != nil || len(left) != 1 || left[0].ID != ids[2] {
		t.Fatalf("pending after marking 2: %v (%v), want %s", left, err, ids[2])
	}
	if n, _, err := s.Unpublished(ctx); err != nil || n != 1 {
		t.Fatalf("unpublished: %d, %v; want 1", n, err)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
