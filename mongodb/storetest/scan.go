package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// scanAll runs Scan over r and returns the streams in the order seen.
func scanAll(t *testing.T, s store, r domain.ScanRange) ([]string, map[string][]domain.Event) {
	t.Helper()
	var order []string
	got := map[string][]domain.Event{}
	err := s.Scan(t.Context(), r, func(st domain.StreamEvents) error {
		if st.Err != nil {
			t.Errorf("stream %s: %v", st.StreamID, st.Err)
		}
		if _, dup := got[st.StreamID]; dup {
			t.Errorf("stream %s reported twice: its commits are not contiguous in log order", st.StreamID)
		}
		order = append(order, st.StreamID)
		got[st.StreamID] = st.Events
		return nil
	})
	if err != nil {
		t.Fatalf("scan %+v: %v", r, err)
	}
	return order, got
}

// testScan: a full scan reports every stream once, whole and in version
// order, in log order; partitions from Bounds cover the log exactly once;
// a scan resumed after a stream reports exactly the streams after it; a
// recorded-time range keeps only the commits recorded in it.
func testScan(t *testing.T, s store) {
	// Streams whose ids are prefixes of one another (the case where log
	// order, by stream id + ":", differs from plain id order), two commits
	// each, interleaved in time.
	suffix := Unique("")
	var ids []string
	for _, base := range []string{"b", "a", "ab", "a1", "a-b", "a_"} {
		ids = append(ids, base+"-"+suffix)
	}
	ids = append(ids, "a-"+suffix+"-x") // a prefix of nothing, prefixed by another
	events := map[string][]domain.Event{}
	for _, id := range ids {
		c := NewCommit(id, 0, placed("cust-scan"))
		events[id] = append(events[id], appendRecorded(t, s, c)...)
	}
	time.Sleep(5 * time.Millisecond) // recorded times are in milliseconds
	for _, id := range ids {
		c := NewCommit(id, 1, domain.OrderApproved{}, domain.OrderShipped{})
		events[id] = append(events[id], appendRecorded(t, s, c)...)
	}
	order, got := scanAll(t, s, domain.ScanRange{})
	want := slices.Clone(ids)
	// Log order: MongoDB orders string _ids bytewise, as strings.Compare.
	slices.SortFunc(want, func(a, b string) int { return strings.Compare(a+":", b+":") })
	if !slices.Equal(order, want) {
		t.Fatalf("scan order %v, want log order %v", order, want)
	}
	for _, id := range ids {
		if d := DiffEvents(events[id], got[id]); d != "" {
			t.Errorf("stream %s: %s", id, d)
		}
	}
	for n := 1; n <= 4; n++ {
		bounds, commits, err := s.Bounds(t.Context(), n)
		if err != nil {
			t.Fatal(err)
		}
		if total, err := s.Commits(t.Context()); err != nil || commits != total {
			t.Fatalf("Bounds(%d) counted %d commits; Commits says %d (%v)", n, commits, total, err)
		}
		if len(bounds) > n-1 || !slices.IsSortedFunc(bounds, func(a, b string) int { return strings.Compare(a+":", b+":") }) {
			t.Fatalf("Bounds(%d) = %v", n, bounds)
		}
		edges := append(append([]string{""}, bounds...), "")
		var union []string
		for i := 0; i+1 < len(edges); i++ {
			part, _ := scanAll(t, s, domain.ScanRange{From: edges[i], To: edges[i+1]})
			if len(part) == 0 {
				t.Errorf("Bounds(%d): partition %d [%q, %q) is empty", n, i, edges[i], edges[i+1])
			}
			union = append(union, part...)
		}
		if !slices.Equal(union, want) {
			t.Errorf("Bounds(%d) = %v: partitions give %v, want %v", n, bounds, union, want)
		}
	}
	for i, after := range want {
		rest, _ := scanAll(t, s, domain.ScanRange{After: after})
		if !slices.Equal(rest, want[i+1:]) {
			t.Errorf("resume after %s: %v, want %v", after, rest, want[i+1:])
		}
		// A partition that starts after the cursor wins over it.
		if i > 0 {
			from, _ := scanAll(t, s, domain.ScanRange{From: want[i], After: want[0]})
			if !slices.Equal(from, want[i:]) {
				t.Errorf("from %s after %s: %v, want %v", want[i], want[0], from, want[i:])
			}
		}
	}
	second := events[ids[0]][1].RecordedAt
	_, recent := scanAll(t, s, domain.ScanRange{RecordedFrom: second, RecordedTo: second.Add(time.Hour)})
	for _, id := range ids {
		if d := DiffEvents(events[id][1:], recent[id]); d != "" {
			t.Errorf("recorded from %s, stream %s: %s", second, id, d)
		}
	}
}

// testBoundsBalanced: on a log of more commits than Bounds samples, the
// partitions it cuts hold about equal numbers of commits, and it counts
// them all.
func testBoundsBalanced(t *testing.T, s store) {
	const streams, n = 3000, 4 // two commits each: 6,000 commits
	docs := make([]any, 0, 2*streams)
	for i := range streams {
		id := fmt.Sprintf("bounds-%05d", i)
		for v := int64(1); v <= 2; v++ {
			docs = append(docs, bson.D{{Key: "_id", Value: mongodb.CommitID(id, v)}, {Key: "stream_id", Value: id}, {Key: "first_version", Value: v}})
		}
	}
	if _, err := s.db.Collection(mongodb.CommitsCollection).InsertMany(t.Context(), docs); err != nil {
		t.Fatal(err)
	}
	bounds, commits, err := s.Bounds(t.Context(), n)
	if err != nil {
		t.Fatal(err)
	}
	if commits != int64(len(docs)) || len(bounds) != n-1 {
		t.Fatalf("Bounds(%d) = %v, %d commits; want %d bounds and %d commits", n, bounds, commits, n-1, len(docs))
	}
	edges := append(append([]string{"bounds-"}, bounds...), "bounds-99999")
	for i := 0; i+1 < len(edges); i++ {
		var lo, hi int
		fmt.Sscanf(edges[i], "bounds-%d", &lo)
		fmt.Sscanf(edges[i+1], "bounds-%d", &hi)
		if i+1 == len(edges)-1 {
			hi = streams
		}
		// A uniform sample of 4,096 of 6,000 puts a quartile within a
		// few dozen streams of the true one.
		if size := hi - lo; size < streams/n*9/10 || size > streams/n*11/10 {
			t.Errorf("partition %d [%s, %s) holds %d streams of %d, want about %d", i, edges[i], edges[i+1], size, streams, streams/n)
		}
	}
}
