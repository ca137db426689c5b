package outbox

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// TestMarkQueueWaitsForRoom: a publish round that finds the marker queue
// full waits until the marker loop takes some, so under a steady load no
// marker is dropped (each dropped one is a commit the sweep republishes);
// only a round cut short by shutdown leaves the rest to the sweep.
func TestMarkQueueWaitsForRoom(t *testing.T) {
	q := newMarkQueue(3)
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("c%d", i))
	}
	added := make(chan int)
	go func() { added <- q.add(t.Context(), want) }()
	var got []string
	for len(got) < len(want) { // as markLoop: take while there is any, then wait
		ids := q.take(2)
		if len(ids) == 0 {
			<-q.ready
		}
		got = append(got, ids...)
	}
	if dropped := <-added; dropped != 0 || !slices.Equal(got, want) {
		t.Fatalf("taken %v with %d dropped, want every marker in order", got, dropped)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if dropped := q.add(ctx, want); dropped != len(want)-3 {
		t.Fatalf("add on shutdown to an empty queue of 3: %d dropped, want %d", dropped, len(want)-3)
	}
}
