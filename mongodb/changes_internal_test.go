package mongodb

import (
	"slices"
	"testing"
	"time"
)

// A stream's later commit that carries the earlier time (its appender's
// clock behind the other's) takes its predecessor's place in a catch-up:
// each stream's commits come in version order, the log's in time order.
func TestInStreamOrder(t *testing.T) {
	at := time.Now()
	keys := []commitKey{ // sorted by recorded_at
		{ID: "a:0000000003", StreamID: "a", FirstVersion: 3, RecordedAt: at},
		{ID: "b:0000000001", StreamID: "b", FirstVersion: 1, RecordedAt: at.Add(time.Millisecond)},
		{ID: "a:0000000001", StreamID: "a", FirstVersion: 1, RecordedAt: at.Add(2 * time.Millisecond)},
		{ID: "b:0000000002", StreamID: "b", FirstVersion: 2, RecordedAt: at.Add(3 * time.Millisecond)},
		{ID: "a:0000000002", StreamID: "a", FirstVersion: 2, RecordedAt: at.Add(4 * time.Millisecond)},
	}
	want := []string{"a:0000000001", "b:0000000001", "a:0000000002", "b:0000000002", "a:0000000003"}
	if got := inStreamOrder(keys); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}
