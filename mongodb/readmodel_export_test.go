package mongodb

import (
	"context"
	"hash/maphash"
	"testing"

	"github.com/orderd/orderd/projection"
)

// CollideVerifyKeys gives every document id the same key in Verify until
// the test ends.
func CollideVerifyKeys(t *testing.T) {
	old := idKey
	idKey = func(maphash.Seed, string) docKey { return 7 }
	t.Cleanup(func() { idKey = old })
}

// PutPointer writes p with the compare-and-set on its generation.
func PutPointer(ctx context.Context, ps *Pointers, p projection.Pointer) error { return ps.put(ctx, p) }

// PointersOf is the Pointers p reads its pointer through.
func PointersOf[D any](p *Projection[D]) *Pointers { return p.pointers }
