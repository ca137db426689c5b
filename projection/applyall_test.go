package projection_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// recorder applies a delivery by recording the collections written, in
// order, and failing those fail names.
type recorder struct {
	written []string
	fail    map[string]error
}

func (r *recorder) applyTo(n int) func(coll string) (projection.Outcome, map[string]error, error) {
	return func(coll string) (projection.Outcome, map[string]error, error) {
		r.written = append(r.written, coll)
		if err := r.fail[coll]; err != nil {
			return projection.Outcome{}, nil, err
		}
		return projection.Outcome{Applied: n}, map[string]error{coll: nil}, nil
	}
}

// TestApplyAllWritesTheShadowFirst: a delivery goes to every collection of
// its version the pointer names, the shadow first and the active one last.
func TestApplyAllWritesTheShadowFirst(t *testing.T) {
	active := projection.Pointer{Projection: "p", Active: "p_v2_a", ActiveVersion: 2, Generation: 3}
	rebuilding := active
	rebuilding.Shadow, rebuilding.ShadowVersion, rebuilding.Generation = "p_v2_b", 2, 4
	switched := projection.Pointer{Projection: "p", Active: "p_v2_b", ActiveVersion: 2, Previous: "p_v2_a", PreviousVersion: 2, Generation: 5}
	other := projection.Pointer{Projection: "p", Active: "p_v1", ActiveVersion: 1, Shadow: "p_v2_b", ShadowVersion: 2, Generation: 6}
	for _, tc := range []struct {
		name    string
		pointer projection.Pointer
		want    []string
		last    string // whose results are returned ("": none)
	}{
		{"the active collection", active, []string{"p_v2_a"}, "p_v2_a"},
		{"during a rebuild: the shadow first", rebuilding, []string{"p_v2_b", "p_v2_a"}, "p_v2_a"},
		{"after a switch: the previous before the active", switched, []string{"p_v2_a", "p_v2_b"}, "p_v2_b"},
		{"only the collections of this version", other, []string{"p_v2_b"}, "p_v2_b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			out, poison, err := projection.ApplyAll(tc.pointer, 2, r.applyTo(1))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.written, tc.want) {
				t.Errorf("wrote %v, want %v", r.written, tc.want)
			}
			if _, ok := poison[tc.last]; !ok || out.Applied != 1 {
				t.Errorf("results %v %+v, want those of %s", poison, out, tc.last)
			}
		})
	}
	t.Run("an earlier collection's failure fails the delivery, named", func(t *testing.T) {
		r := &recorder{fail: map[string]error{"p_v2_b": domain.ErrUnavailable}}
		_, _, err := projection.ApplyAll(rebuilding, 2, r.applyTo(1))
		if !errors.Is(err, domain.ErrUnavailable) || !slices.Equal(r.written, []string{"p_v2_b"}) {
			t.Errorf("err %v after writing %v; want ErrUnavailable after the shadow alone", err, r.written)
		}
	})
}
