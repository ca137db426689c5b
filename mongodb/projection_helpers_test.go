package mongodb_test

import (
	"slices"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
)

// lastEvents is the last event of every stream.
func lastEvents(f *projectiontest.Fixture) []domain.Event {
	var out []domain.Event
	for _, id := range f.IDs {
		evs := f.Events[id]
		out = append(out, evs[len(evs)-1])
	}
	return out
}

// multiEventStreams counts the streams with more than one event: those
// whose last event alone is a gap.
func multiEventStreams(f *projectiontest.Fixture) int {
	n := 0
	for _, id := range f.IDs {
		if len(f.Events[id]) > 1 {
			n++
		}
	}
	return n
}

func reversed(evs []domain.Event) []domain.Event {
	out := slices.Clone(evs)
	slices.Reverse(out)
	return out
}
