package projection

import (
	"context"
	"time"
)

// Store is the storage of a read model of one document per stream, in
// named collections (the active one, a rebuild's shadow, the one a switch
// replaced): it loads and stores documents, and every store is a
// compare-and-set on the document's version, so no write, however late
// it lands, moves a document back (invariant 4). The fold, the loop over
// a batch, verify and the rebuild's writes are this package's; the
// MongoDB adapter's *mongodb.Documents implements Store. Its errors are
// domain.ErrUnavailable when the store cannot be reached.
type Store[D any] interface {
	// Load returns the documents of coll with the given ids that exist.
	Load(ctx context.Context, coll string, ids []string) (map[string]D, error)
	// Save writes each document of docs, in one unordered bulk write,
	// over a stored document of an older version only (or where there is
	// none), and returns the indexes of those the guard refused: a newer
	// version is stored, and the write is done. After an error any of
	// them may or may not be written.
	Save(ctx context.Context, coll string, docs []Doc[D]) (refused map[int]bool, err error)
	// Insert inserts docs (a rebuild's batch) in one unordered insert and
	// returns the indexes of those whose id is taken.
	Insert(ctx context.Context, coll string, docs []Doc[D]) (taken map[int]bool, err error)
	// Overwrite sets document id of coll to doc if it is still at version
	// stored (exists false: if there is none): the one write that may
	// lower a version, for a verify's repair. A document that changed in
	// between is left as it is.
	Overwrite(ctx context.Context, coll, id string, doc D, stored int64, exists bool) error
	// Delete deletes document id of coll, if any.
	Delete(ctx context.Context, coll, id string) error
	// Each calls fn with every document of coll, in no given order; fn's
	// error stops it and is returned.
	Each(ctx context.Context, coll string, fn func(id string, doc D) error) error
	// EnsureIndexes creates indexes on coll: single or compound ascending,
	// as field lists.
	EnsureIndexes(ctx context.Context, coll string, indexes [][]string) error
	// SaveSums records sums in SumsCollection(coll), replacing those of
	// the same ids.
	SaveSums(ctx context.Context, coll string, sums []Sum) error
	// EachSum calls fn with every sum recorded for coll.
	EachSum(ctx context.Context, coll string, fn func(Sum) error) error
}

// Doc is a document with its stream id.
type Doc[D any] struct {
	ID  string
	Doc D
}

// Sum is what a rebuild's scan records of one document it wrote: its
// stream version and the DocHash of its fold.
type Sum struct {
	ID      string
	Version int64
	Hash    [32]byte
}

// Pointers reads the projections' pointer documents.
type Pointers interface {
	// Get returns projection name's pointer, read from the store unless
	// this process read it less than maxAge ago; base is the projection's
	// base collection, the active one while it has no pointer document.
	// Errors: domain.ErrUnavailable.
	Get(ctx context.Context, name, base string, maxAge time.Duration) (Pointer, error)
	// Last is Get for readers: when the read fails it returns the
	// pointer this process read last, if any.
	Last(ctx context.Context, name, base string, maxAge time.Duration) (Pointer, error)
	// Update reads the pointer of projection name, lets change change it
	// (false: leave it) and writes it with a compare-and-set on its
	// generation, again from a fresh read when another write came first
	// (a few times). It returns the pointer as stored, or as read when
	// nothing was written. Errors: change's, domain.ErrPointerMoved
	// (wrapped) when every compare-and-set was lost,
	// domain.ErrUnavailable.
	Update(ctx context.Context, name, base string, change func(p *Pointer) (bool, error)) (Pointer, error)
}
