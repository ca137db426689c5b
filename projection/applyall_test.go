package projection_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// scripted is a projection's storage whose pointer moves as the test
// says: pointers[i] is the answer to the i-th read (the last one
// repeats). It records the collections written, in order.
type scripted struct {
	pointers []projection.Pointer
	reads    int
	written  []string
	fail     map[string]error
}

func (s *scripted) Pointer(context.Context, time.Duration) (projection.Pointer, error) {
	p := s.pointers[min(s.reads, len(s.pointers)-1)]
	s.reads++
	return p, nil
}

func (s *scripted) ApplyTo(_ context.Context, coll string, events []domain.Event) (projection.Outcome, map[string]error, error) {
	s.written = append(s.written, coll)
	if err := s.fail[coll]; err != nil {
		return projection.Outcome{}, nil, err
	}
	return projection.Outcome{Applied: len(events)}, map[string]error{coll: nil}, nil
}

// TestApplyAllWritesTheShadowFirst: a delivery goes to every collection of
// its version the pointer names, the shadow first and the active one last,
// on one read of the pointer.
func TestApplyAllWritesTheShadowFirst(t *testing.T) {
	evs := []domain.Event{{StreamID: "o-1", Version: 1}}
	active := projection.Pointer{Projection: "p", Active: "p_v2_a", ActiveVersion: 2, Generation: 3}
	rebuilding := active
	rebuilding.Shadow, rebuilding.ShadowVersion, rebuilding.Generation = "p_v2_b", 2, 4
	switched := projection.Pointer{Projection: "p", Active: "p_v2_b", ActiveVersion: 2, Previous: "p_v2_a", PreviousVersion: 2, Generation: 5}
	other := projection.Pointer{Projection: "p", Active: "p_v1", ActiveVersion: 1, Shadow: "p_v2_b", ShadowVersion: 2, Generation: 6}
	for _, tc := range []struct {
		name     string
		pointers []projection.Pointer
		want     []string
		last     string // whose results are returned ("": none)
	}{
		{"the active collection", []projection.Pointer{active}, []string{"p_v2_a"}, "p_v2_a"},
		{"during a rebuild: the shadow first", []projection.Pointer{rebuilding}, []string{"p_v2_b", "p_v2_a"}, "p_v2_a"},
		{"after a switch: the previous before the active", []projection.Pointer{switched}, []string{"p_v2_a", "p_v2_b"}, "p_v2_b"},
		{"only the collections of this version", []projection.Pointer{other}, []string{"p_v2_b"}, "p_v2_b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{pointers: tc.pointers}
			out, poison, err := projection.ApplyAll(context.Background(), s, 2, time.Second, evs)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.written, tc.want) || s.reads != 1 {
				t.Errorf("wrote %v on %d reads of the pointer, want %v on one", s.written, s.reads, tc.want)
			}
			if _, ok := poison[tc.last]; !ok || out.Applied != 1 {
				t.Errorf("results %v %+v, want those of %s", poison, out, tc.last)
			}
		})
	}
	t.Run("an earlier collection's failure fails the delivery, named", func(t *testing.T) {
		s := &scripted{pointers: []projection.Pointer{rebuilding}, fail: map[string]error{"p_v2_b": domain.ErrUnavailable}}
		_, _, err := projection.ApplyAll(context.Background(), s, 2, time.Second, evs)
		if !errors.Is(err, domain.ErrUnavailable) || !slices.Equal(s.written, []string{"p_v2_b"}) {
			t.Errorf("err %v after writing %v; want ErrUnavailable after the shadow alone", err, s.written)
		}
	})
}
