package mongodb

import (
	"context"

	"github.com/orderd/orderd/projection"
)

// PutPointer writes p with the compare-and-set on its generation.
func PutPointer(ctx context.Context, ps *Pointers, p projection.Pointer) error { return ps.put(ctx, p) }
