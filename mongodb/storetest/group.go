package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
)

// Group commit: appends that arrive together are written in one insert,
// and each must still get its own outcome. The appends of each test are
// let go at once from goroutines of their own, so most share inserts; a
// write error given to the wrong append shows as a refused good commit, a
// stored refused one, or the wrong error.

// testGroupManyStreams: many goroutines appending to streams of their own
// all succeed, and every stream holds exactly its own commits.
func testGroupManyStreams(t *testing.T, s store) {
	const (
		writers = 64
		rounds  = 4
	)
	streams := make([]string, writers)
	for i := range streams {
		streams[i] = Unique("order-")
	}
	want := make([][]domain.Event, writers)
	for r := range rounds {
		commits := make([]domain.Commit, writers)
		for i, id := range streams {
			var data []domain.EventData
			if r == 0 {
				data = append(data, placed(fmt.Sprintf("cust-%d", i)))
			} else {
				data = append(data, domain.OrderCanceled{Reason: fmt.Sprintf("writer %d round %d", i, r)})
			}
			for range i % 3 {
				data = append(data, domain.OrderApproved{})
			}
			commits[i] = NewCommit(id, int64(len(want[i])), data...)
		}
		ats, errs := appendAtOnce(t, s, commits)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: writer %d: %v, want stored", r, i, err)
			}
			want[i] = append(want[i], recorded(commits[i], ats[i])...)
		}
	}
	for i, id := range streams {
		wantEvents(t, s, id, want[i])
	}
	wantCommits(t, s, bson.D{}, writers*rounds)
}

// testGroupMixedOutcomes lets go at once, in a random order, good commits
// and commits that must fail for a reason of their own: a stale expected
// version (ErrVersionConflict), the retry of a stored request with its
// key at the stream's head (ErrDuplicateRequest through the key index)
// and at the version it took (through the commit id), and two rivals for
// one new stream (one wins, the other conflicts). Each gets exactly its
// own outcome, and only the winners are stored.
func testGroupMixedOutcomes(t *testing.T, s store) {
	const perKind = 12
	type want int
	const (
		stored want = iota
		conflict
		duplicate
		rival // one of two per stream wins, the other conflicts
	)
	var (
		commits []domain.Commit
		wants   []want
	)
	add := func(c domain.Commit, w want) {
		commits = append(commits, c)
		wants = append(wants, w)
	}
	for i := range perKind {
		// Good: a new stream, and the next commit of a stored one, whose
		// key is also used in another stream.
		add(NewCommit(Unique("order-"), 0, placed("cust-new")), stored)
		moved := Unique("order-")
		mustAppend(t, s, NewCommit(moved, 0, placed("cust-moved")))
		next := NewCommit(moved, 1, domain.OrderApproved{})
		next.IdempotencyKey, next.RequestHash = Unique("key-"), "sha256:next"
		add(next, stored)

		// A stale version: the stream moved past v0.
		add(NewCommit(moved, 0, placed("cust-stale")), conflict)

		// A replayed request: same key, same request hash, at the new
		// head and at the version the first one took.
		keyed := Unique("order-")
		first := NewCommit(keyed, 0, placed("cust-keyed"))
		first.IdempotencyKey, first.RequestHash = next.IdempotencyKey, "sha256:first"
		mustAppend(t, s, first)
		for _, at := range []int64{1, 0} {
			replay := NewCommit(keyed, at, placed("cust-keyed"))
			replay.IdempotencyKey, replay.RequestHash = first.IdempotencyKey, first.RequestHash
			add(replay, duplicate)
		}

		// Two rivals for a new stream.
		contested := Unique("order-")
		add(NewCommit(contested, 0, placed(fmt.Sprintf("cust-rival-%d-a", i))), rival)
		add(NewCommit(contested, 0, placed(fmt.Sprintf("cust-rival-%d-b", i))), rival)
	}
	order := rand.Perm(len(commits))
	shuffled := make([]domain.Commit, len(commits))
	for i, j := range order {
		shuffled[i] = commits[j]
	}
	ats, errs := appendAtOnce(t, s, shuffled)

	rivals := map[string][]error{}
	for i, j := range order {
		c, err := commits[j], errs[i]
		what := fmt.Sprintf("append %s at v%d (key %q)", c.StreamID, c.ExpectedVersion, c.IdempotencyKey)
		switch wants[j] {
		case stored:
			if err != nil {
				t.Errorf("%s: %v, want stored", what, err)
				continue
			}
			evs := mustLoad(t, s, c.StreamID)
			if d := DiffEvents(recorded(c, ats[i]), evs[c.ExpectedVersion:]); d != "" {
				t.Errorf("%s: %s", what, d)
			}
		case conflict:
			if !errors.Is(err, domain.ErrVersionConflict) {
				t.Errorf("%s: %v, want ErrVersionConflict", what, err)
			}
		case duplicate:
			if !errors.Is(err, domain.ErrDuplicateRequest) {
				t.Errorf("%s: %v, want ErrDuplicateRequest", what, err)
			}
		case rival:
			rivals[c.StreamID] = append(rivals[c.StreamID], err)
		}
		if wants[j] != stored && wants[j] != rival {
			for _, e := range mustLoad(t, s, c.StreamID) {
				if e.ID == c.Events[0].ID {
					t.Errorf("%s: refused, but its events are stored", what)
				}
			}
		}
	}
	for stream, errs := range rivals {
		oneWinner(t, "rivals for "+stream, errs, domain.ErrVersionConflict)
		wantCommits(t, s, inStream(stream), 1)
	}
}
