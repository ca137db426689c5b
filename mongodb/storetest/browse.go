package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// testBrowse pages the log newest first, whole and filtered, on whichever
// side of the dialect seam the store takes: every commit once, in
// recorded order, with a cursor that continues exactly where the page
// ended, and filters that keep exactly the commits they name. A filtered
// page comes back full or at the log's end, unless its search ran out of
// time: then it says so, and its cursor continues the search. A store
// whose type search examines one commit at a time with no time to spare
// (WithBrowseSearch) answers each page after one step, and paging still
// finds every match once.
func testBrowse(t *testing.T, s store) {
	ctx := t.Context()
	hurried := mongodb.NewEventStore(s.db, mongodb.WithBrowseSearch(time.Nanosecond, 1))
	a, b := Unique("order-"), Unique("order-")
	commits := []domain.Commit{
		NewCommit(a, 0, placed("cust-1")),
		NewCommit(b, 0, placed("cust-2")),
		NewCommit(a, 1, domain.OrderApproved{}, domain.OrderInvoiced{}),
		NewCommit(b, 1, domain.OrderCanceled{Reason: "test"}),
		NewCommit(a, 3, domain.OrderShipped{}),
		NewCommit(a, 4, domain.OrderDelivered{}),
		NewCommit(b, 2, domain.OrderApproved{}),
	}
	for _, c := range commits {
		at := mustAppend(t, s, c)
		// The next commit is recorded in a later millisecond, so that the
		// log's order by recorded time (MongoDB's path) is the order of
		// the appends, as its commit order (the embedded store's) is.
		for !time.Now().After(at.Add(time.Millisecond)) {
			time.Sleep(100 * time.Microsecond)
		}
	}
	pages := func(s *mongodb.EventStore, q domain.LogQuery) (out []domain.LogCommit, timedOut int) {
		t.Helper()
		for pages := 0; ; pages++ {
			if pages > len(commits)+1 {
				t.Fatalf("%+v: more pages than commits", q)
			}
			p, err := s.Browse(ctx, q)
			if err != nil {
				t.Fatalf("browse %+v: %v", q, err)
			}
			switch {
			case len(p.Commits) > q.Limit:
				t.Fatalf("browse %+v: %d commits in a page of %d", q, len(p.Commits), q.Limit)
			case p.DeadlineReached && p.Next == "":
				t.Fatalf("browse %+v: out of time with no cursor to go on", q)
			case p.DeadlineReached:
				timedOut++
			case p.Next != "" && len(p.Commits) < q.Limit:
				t.Fatalf("browse %+v: %d commits and a cursor, in time", q, len(p.Commits))
			}
			out = append(out, p.Commits...)
			if p.Next == "" {
				return out, timedOut
			}
			q.Cursor = p.Next
		}
	}
	all := func(q domain.LogQuery) []domain.LogCommit {
		t.Helper()
		out, timedOut := pages(s.EventStore, q)
		if timedOut > 0 {
			t.Errorf("browse %+v: %d pages out of time on a log of %d commits", q, timedOut, len(commits))
		}
		return out
	}
	ids := func(cs []domain.LogCommit) []string {
		out := make([]string, len(cs))
		for i, c := range cs {
			out[i] = c.ID
		}
		return out
	}
	want := func(pick func(i int, c domain.Commit) bool) []string {
		var out []string
		for i := len(commits) - 1; i >= 0; i-- {
			if pick(i, commits[i]) {
				out = append(out, mongodb.CommitID(commits[i].StreamID, commits[i].ExpectedVersion+1))
			}
		}
		return out
	}
	whole := all(domain.LogQuery{Limit: 200})
	if got := ids(whole); !slices.Equal(got, want(func(int, domain.Commit) bool { return true })) {
		t.Fatalf("whole log newest first: %q", got)
	}
	inv := whole[4] // a's second commit: v2..v3
	if inv.StreamID != a || inv.FirstVersion != 2 || inv.LastVersion != 3 || len(inv.Events) != 2 ||
		inv.Events[1].Type != domain.TypeOrderInvoiced || inv.Events[0].Metadata.CorrelationID != commits[2].Events[0].Metadata.CorrelationID {
		t.Errorf("a's second commit as browsed: %+v", inv)
	}
	for _, limit := range []int{1, 2, 3} {
		if got := ids(all(domain.LogQuery{Limit: limit})); !slices.Equal(got, ids(whole)) {
			t.Errorf("pages of %d: %q, want %q", limit, got, ids(whole))
		}
		got := ids(all(domain.LogQuery{Limit: limit, StreamID: a}))
		if w := want(func(_ int, c domain.Commit) bool { return c.StreamID == a }); !slices.Equal(got, w) {
			t.Errorf("stream %s in pages of %d: %q, want %q", a, limit, got, w)
		}
		approved := want(func(i int, _ domain.Commit) bool { return i == 2 || i == 6 })
		got = ids(all(domain.LogQuery{Limit: limit, Type: domain.TypeOrderApproved}))
		if !slices.Equal(got, approved) {
			t.Errorf("type OrderApproved in pages of %d: %q, want %q", limit, got, approved)
		}
		found, timedOut := pages(hurried, domain.LogQuery{Limit: limit, Type: domain.TypeOrderApproved})
		if got := ids(found); !slices.Equal(got, approved) || timedOut == 0 {
			t.Errorf("type OrderApproved in pages of %d, one commit examined a page: %q with %d pages out of time, want %q and some",
				limit, got, timedOut, approved)
		}
		corr := commits[3].Events[0].Metadata.CorrelationID
		got = ids(all(domain.LogQuery{Limit: limit, CorrelationID: corr}))
		if w := want(func(i int, _ domain.Commit) bool { return i == 3 }); !slices.Equal(got, w) {
			t.Errorf("correlation id %s in pages of %d: %q, want %q", corr, limit, got, w)
		}
		got = ids(all(domain.LogQuery{Limit: limit, StreamID: b, Type: domain.TypeOrderApproved}))
		if w := want(func(i int, _ domain.Commit) bool { return i == 6 }); !slices.Equal(got, w) {
			t.Errorf("stream %s and type OrderApproved in pages of %d: %q, want %q", b, limit, got, w)
		}
	}
	c, found, err := s.LogCommit(ctx, whole[0].ID)
	if err != nil || !found || c.ID != whole[0].ID || len(c.Events) != 1 {
		t.Errorf("commit %s: %+v %v %v", whole[0].ID, c, found, err)
	}
	if _, found, err := s.LogCommit(ctx, a+":0000000099"); found || err != nil {
		t.Errorf("a commit the log has not: found %v, %v", found, err)
	}
	p, err := s.Browse(ctx, domain.LogQuery{Limit: 1, StreamID: a})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Browse(ctx, domain.LogQuery{Limit: 1, Cursor: p.Next}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("a stream's cursor for the whole log: %v, want ErrValidation", err)
	}
	if _, err := s.Browse(ctx, domain.LogQuery{Limit: 1, Cursor: "not a cursor"}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("a cursor that is none: %v, want ErrValidation", err)
	}
}
