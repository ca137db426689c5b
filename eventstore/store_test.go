package eventstore_test

import (
	"errors"
	"testing"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
)

// The append hook hears of each stored commit once, in append order, with
// the events Load returns, and of no refused append.
func TestAppendHook(t *testing.T) {
	var got []eventstore.Committed
	s, _ := openStore(t, eventstore.WithAppendHook(func(c eventstore.Committed) { got = append(got, c) }))
	ctx := t.Context()
	stream := storetest.Unique("order-")
	c1 := storetest.NewCommit(stream, 0, domain.OrderApproved{}, domain.OrderInvoiced{})
	c1.IdempotencyKey = storetest.Unique("key-")
	if _, err := s.Append(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, storetest.NewCommit(stream, 2, domain.OrderShipped{})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, storetest.NewCommit(stream, 2, domain.OrderDelivered{})); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("stale append: %v", err)
	}
	dup := storetest.NewCommit(stream, 3, domain.OrderDelivered{})
	dup.IdempotencyKey = c1.IdempotencyKey
	if _, err := s.Append(ctx, dup); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Fatalf("duplicate key: %v", err)
	}

	if len(got) != 2 {
		t.Fatalf("the hook heard of %d commits, want the 2 stored", len(got))
	}
	loaded, err := s.Load(ctx, stream, 0)
	if err != nil {
		t.Fatal(err)
	}
	var heard []domain.Event
	for i, c := range got {
		if want := eventstore.CommitID(stream, []int64{1, 3}[i]); c.ID() != want || c.StreamID() != stream {
			t.Errorf("commit %d: id %s of %s, want %s of %s", i, c.ID(), c.StreamID(), want, stream)
		}
		evs, err := c.Events()
		if err != nil {
			t.Fatalf("commit %d events: %v", i, err)
		}
		for _, e := range evs {
			if !e.RecordedAt.Equal(c.RecordedAt()) {
				t.Errorf("commit %d: event recorded at %v, commit at %v", i, e.RecordedAt, c.RecordedAt())
			}
		}
		heard = append(heard, evs...)
	}
	if d := storetest.DiffEvents(loaded, heard); d != "" {
		t.Errorf("the hook's events differ from Load's: %s", d)
	}
}
