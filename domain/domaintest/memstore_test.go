package domaintest_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/domain/domaintest"
)

var (
	ctx   = context.Background()
	clock = time.Date(2024, 6, 1, 12, 0, 0, 987_654_321, time.UTC)
)

// commit returns a commit of n approvals on stream at expected version
// from, with key.
func commit(stream string, from int64, n int, key string) domain.Commit {
	c := domain.Commit{StreamID: stream, StreamType: domain.StreamTypeOrder, ExpectedVersion: from, IdempotencyKey: key, RequestHash: "h-" + key}
	for i := range n {
		v := from + int64(i) + 1
		c.Events = append(c.Events, domain.Event{ID: fmt.Sprintf("%s-e%d", stream, v), StreamID: stream, StreamType: domain.StreamTypeOrder,
			Type: domain.TypeOrderApproved, Version: v, Data: domain.OrderApproved{}})
	}
	return c
}

func newStore() *domaintest.MemStore {
	s := domaintest.NewMemStore()
	s.Now = func() time.Time { return clock }
	return s
}

func TestAppend(t *testing.T) {
	noEvents := commit("s-1", 2, 0, "")
	gap := commit("s-1", 2, 1, "")
	gap.Events[0].Version = 4
	other := commit("s-1", 2, 1, "")
	other.Events[0].StreamID = "s-2"
	noData := commit("s-1", 2, 1, "")
	noData.Events[0].Data = nil
	for _, tc := range []struct {
		name   string
		c      domain.Commit
		err    error
		events int // in s-1 afterwards
	}{
		{"at the head", commit("s-1", 2, 1, ""), nil, 3},
		{"at the head, two events", commit("s-1", 2, 2, "k-new"), nil, 4},
		{"new stream at 0", commit("s-2", 0, 1, ""), nil, 2},
		{"stale version", commit("s-1", 1, 1, ""), domain.ErrVersionConflict, 2},
		{"version ahead", commit("s-1", 3, 1, ""), domain.ErrVersionConflict, 2},
		{"new stream not at 0", commit("s-2", 1, 1, ""), domain.ErrVersionConflict, 2},
		{"key reused at the head", commit("s-1", 2, 1, "k-1"), domain.ErrDuplicateRequest, 2},
		{"key reused at a stale version: the key is checked first", commit("s-1", 0, 1, "k-1"), domain.ErrDuplicateRequest, 2},
		{"key used on another stream: stored there", commit("s-2", 0, 1, "k-1"), nil, 2},
		{"no events", noEvents, domain.ErrValidation, 2},
		{"negative version", commit("s-1", -1, 1, ""), domain.ErrValidation, 2},
		{"event version gap", gap, domain.ErrValidation, 2},
		{"event of another stream", other, domain.ErrValidation, 2},
		{"event without payload", noData, domain.ErrValidation, 2},
		{"bad stream id", commit("s.1", 0, 1, ""), domain.ErrValidation, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			if _, err := s.Append(ctx, commit("s-1", 0, 2, "k-1")); err != nil {
				t.Fatal(err)
			}
			commits, keys := s.Commits(), s.Keys()
			rec, err := s.Append(ctx, tc.c)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("Append = %v, want %v", err, tc.err)
			}
			if n := len(s.Events("s-1")); n != tc.events {
				t.Errorf("s-1 has %d events, want %d", n, tc.events)
			}
			if s.Appends.Load() != 2 {
				t.Errorf("Appends = %d, want 2", s.Appends.Load())
			}
			if tc.err != nil {
				if !rec.IsZero() || s.Commits() != commits || s.Keys() != keys || s.EventCount() != 2 {
					t.Errorf("refused append: recorded %v, %d commits, %d keys, %d events; want nothing stored",
						rec, s.Commits(), s.Keys(), s.EventCount())
				}
				return
			}
			if !rec.Equal(domain.Timestamp(clock)) || rec.Location() != time.UTC {
				t.Errorf("recorded at %v, want %v", rec, domain.Timestamp(clock))
			}
			if s.Commits() != commits+1 || s.EventCount() != 2+len(tc.c.Events) {
				t.Errorf("%d commits, %d events after the append", s.Commits(), s.EventCount())
			}
			evs := s.Events(tc.c.StreamID)
			for _, e := range evs[len(evs)-len(tc.c.Events):] {
				if !reflect.DeepEqual(e.RecordedAt, domain.Timestamp(clock)) {
					t.Errorf("event v%d recorded at %v", e.Version, e.RecordedAt)
				}
			}
			if tc.c.Events[0].RecordedAt != (time.Time{}) {
				t.Error("Append changed the caller's events")
			}
		})
	}
}

func TestLoad(t *testing.T) {
	s := newStore()
	for _, c := range []domain.Commit{commit("s-1", 0, 2, ""), commit("s-1", 2, 1, ""), commit("s-2", 0, 1, "")} {
		if _, err := s.Append(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		stream string
		after  int64
		want   []int64
	}{
		{"s-1", 0, []int64{1, 2, 3}},
		{"s-1", 2, []int64{3}},
		{"s-1", 1, []int64{2, 3}},
		{"s-1", 3, nil},
		{"s-2", 0, []int64{1}},
		{"unknown", 0, nil},
	} {
		evs, err := s.Load(ctx, tc.stream, tc.after)
		var got []int64
		for _, e := range evs {
			if e.StreamID != tc.stream {
				t.Errorf("Load(%s) returned an event of %s", tc.stream, e.StreamID)
			}
			got = append(got, e.Version)
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Load(%s, %d) = %v, %v; want %v", tc.stream, tc.after, got, err, tc.want)
		}
	}
	// Load returns a copy.
	evs, _ := s.Load(ctx, "s-1", 0)
	evs[0].ID = "changed"
	if s.Events("s-1")[0].ID == "changed" {
		t.Error("Load returned the stored events, not a copy")
	}
}

func TestFindIdempotencyKey(t *testing.T) {
	s := newStore()
	stored := commit("s-1", 0, 2, "k-1")
	for _, c := range []domain.Commit{stored, commit("s-1", 2, 1, ""), commit("s-2", 0, 1, "k-2")} {
		if _, err := s.Append(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, key, hint string
		want            string // stream, "" for ErrNotFound
		last            int64
	}{
		{"found", "k-1", "s-1", "s-1", 2},
		{"in another stream only", "k-1", "s-2", "", 0},
		{"no stream", "k-1", "", "", 0},
		{"other stream", "k-2", "s-2", "s-2", 1},
		{"not stored", "k-3", "s-1", "", 0},
		{"empty key", "", "s-1", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := s.FindIdempotencyKey(ctx, tc.key, tc.hint)
			if tc.want == "" {
				if !errors.Is(err, domain.ErrNotFound) {
					t.Fatalf("FindIdempotencyKey = %+v, %v; want ErrNotFound", c, err)
				}
				return
			}
			if err != nil || c.StreamID != tc.want || c.IdempotencyKey != tc.key || c.RequestHash != "h-"+tc.key || c.LastVersion() != tc.last {
				t.Fatalf("FindIdempotencyKey = %+v, %v", c, err)
			}
			for _, e := range c.Events {
				if !e.RecordedAt.Equal(domain.Timestamp(clock)) {
					t.Errorf("event v%d recorded at %v", e.Version, e.RecordedAt)
				}
			}
		})
	}
}

func TestDown(t *testing.T) {
	s := newStore()
	if _, err := s.Append(ctx, commit("s-1", 0, 1, "k-1")); err != nil {
		t.Fatal(err)
	}
	s.Down.Store(true)
	calls := []struct {
		name string
		call func() error
	}{
		{"Append", func() error { _, err := s.Append(ctx, commit("s-1", 1, 1, "")); return err }},
		{"Load", func() error { _, err := s.Load(ctx, "s-1", 0); return err }},
		{"FindIdempotencyKey", func() error { _, err := s.FindIdempotencyKey(ctx, "k-1", "s-1"); return err }},
	}
	for i, c := range calls {
		if err := c.call(); !errors.Is(err, domain.ErrUnavailable) {
			t.Errorf("%s with the store down = %v, want ErrUnavailable", c.name, err)
		}
		if n := s.DownCalls.Load(); n != int64(i+1) {
			t.Errorf("after %s DownCalls = %d, want %d", c.name, n, i+1)
		}
	}
	if s.Appends.Load() != 2 || s.Commits() != 1 || len(s.Events("s-1")) != 1 {
		t.Errorf("Appends %d, commits %d, events %v", s.Appends.Load(), s.Commits(), s.Events("s-1"))
	}
	s.Down.Store(false)
	if _, err := s.Append(ctx, commit("s-1", 1, 1, "")); err != nil || s.DownCalls.Load() != 3 {
		t.Errorf("Append back up = %v, DownCalls %d", err, s.DownCalls.Load())
	}
}

func TestReset(t *testing.T) {
	s := newStore()
	if _, err := s.Append(ctx, commit("s-1", 0, 1, "k-1")); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	if s.Commits() != 0 || s.EventCount() != 0 || s.Streams() != 0 || s.Keys() != 0 || s.Appends.Load() != 0 || s.Events("s-1") != nil {
		t.Fatalf("after Reset: %d commits, %d events, %d streams, %d keys, %d appends", s.Commits(), s.EventCount(), s.Streams(), s.Keys(), s.Appends.Load())
	}
	if _, err := s.Append(ctx, commit("s-1", 0, 1, "k-1")); err != nil {
		t.Fatalf("the same commit after Reset: %v", err)
	}
}

func TestZeroValue(t *testing.T) {
	var s domaintest.MemStore
	if evs, err := s.Load(ctx, "s-1", 0); err != nil || evs != nil {
		t.Fatalf("Load = %v, %v", evs, err)
	}
	before := time.Now()
	rec, err := s.Append(ctx, commit("s-1", 0, 1, ""))
	if err != nil || rec.Before(domain.Timestamp(before)) || rec != domain.Timestamp(rec) || s.Streams() != 1 {
		t.Fatalf("Append = %v, %v", rec, err)
	}
}

// Appenders racing at one expected version: exactly one wins, the others
// get ErrVersionConflict (or ErrDuplicateRequest for the winner's key).
func TestConcurrentAppenders(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("same key=%v", keyed), func(t *testing.T) {
			s := newStore()
			if _, err := s.Append(ctx, commit("s-1", 0, 1, "")); err != nil {
				t.Fatal(err)
			}
			const n = 32
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				key := fmt.Sprintf("k-%d", i)
				if keyed {
					key = "k"
				}
				wg.Go(func() {
					<-start
					_, errs[i] = s.Append(ctx, commit("s-1", 1, 1, key))
				})
			}
			close(start)
			wg.Wait()
			wins := 0
			for _, err := range errs {
				switch {
				case err == nil:
					wins++
				case keyed && errors.Is(err, domain.ErrDuplicateRequest):
				case !keyed && errors.Is(err, domain.ErrVersionConflict):
				default:
					t.Errorf("losing Append = %v", err)
				}
			}
			if wins != 1 || s.Commits() != 2 || len(s.Events("s-1")) != 2 || s.Keys() != 1 || s.Appends.Load() != n+1 {
				t.Fatalf("%d wins, %d commits, %d events, %d keys, %d appends; want 1, 2, 2, 1, %d",
					wins, s.Commits(), len(s.Events("s-1")), s.Keys(), s.Appends.Load(), n+1)
			}
		})
	}
}
