package mongodb

import (
	"context"
	"hash/maphash"
	"testing"

	"github.com/orderd/orderd/domain"
)

// CollideVerifyKeys gives every document id the same key in Verify until
// the test ends.
func CollideVerifyKeys(t *testing.T) {
	old := idKey
	idKey = func(maphash.Seed, string) docKey { return 7 }
	t.Cleanup(func() { idKey = old })
}

// Fold is p's fold of one stream's events.
func Fold[D any](p *Projection[D], evs []domain.Event) (D, int, error) { return p.fold(evs) }

// DocHash is the hash Verify compares doc by.
func DocHash[D any](doc D) ([32]byte, error) { return docHash(doc) }

// PutPointer writes p with the compare-and-set on its generation.
func PutPointer(ctx context.Context, ps *Pointers, p Pointer) error { return ps.put(ctx, p) }

// PointersOf is the Pointers p reads its pointer through.
func PointersOf[D any](p *Projection[D]) *Pointers { return p.pointers }
