package projection

import (
	"context"

	"github.com/orderd/orderd/domain"
)

// What a rebuild and a verify (package jobs) exchange with the storage of
// the read models (package mongodb's Projection: WriteFolds, VerifySums,
// Verify).

// SumsCollection is the collection in which a rebuild's scan records, for
// each document it writes into shadow (the adapter's WriteFolds), the
// document's version and hash: one document per stream. The rebuild's
// finish checks the shadow against them (the adapter's VerifySums) instead
// of folding the whole log a second time. It belongs to the shadow's
// rebuild, which retires it with the shadow or drops it after its switch.
func SumsCollection(shadow string) string { return shadow + "_sums" }

// FoldResult counts what writing a rebuild's batch of folded streams did.
type FoldResult struct {
	Events  int64
	Poison  int64    // streams with an event that could not be read or applied
	Errors  []string // the first few poison errors
	Guarded int64    // documents of a batch whose insert met existing ones, applied through the version guard
}

// VerifyProgress is reported while a verify runs: streams, events and
// commits of the log read so far, and the last stream read (its id).
type VerifyProgress struct {
	Streams, Events, Commits int64
	Cursor                   string
}

// Scanner reads the event log stream by stream in log order (the events
// of each stream of r, in version order), as a verify folds it; the event
// store (package mongodb's EventStore) implements it. It returns fn's
// error, or the store's (domain.ErrUnavailable).
type Scanner interface {
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
}
