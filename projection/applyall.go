package projection

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
)

// Collections is a projection's storage as ApplyAll writes a delivery
// into it: its pointer, and the collections the pointer names.
type Collections interface {
	// Pointer returns the projection's pointer, read from the store
	// unless this process read it less than maxAge ago. Errors:
	// domain.ErrUnavailable.
	Pointer(ctx context.Context, maxAge time.Duration) (Pointer, error)
	// ApplyTo advances the documents of the events' streams in collection
	// coll (Definition.Advance) and stores them. It returns what it did,
	// the poison streams (a *PoisonError each), and an error that may
	// pass (domain.ErrUnavailable, ctx's), after which nothing is known to
	// be written.
	ApplyTo(ctx context.Context, coll string, events []domain.Event) (Outcome, map[string]error, error)
}

// ApplyAll writes a delivery of events (any streams, any order, duplicates
// allowed) into every collection of version v the pointer (read at most
// pointerAge old) names: a
// rebuild's shadow first, then the previous collection (kept for a switch
// back), then the active one, so that during a rebuild the shadow is never
// behind the active collection on any document this process touched (the
// switch then never shows a reader an older version). Collections of
// other versions are left to the processes that fold those. A collection
// the pointer names once the batch is written and did not at its start
// (a shadow announced meanwhile) is written last, from a fresh read of
// the pointer.
//
// The results are those of the last collection written (the active one
// when it is of this version), as Collections.ApplyTo gives them: what it did,
// and per stream a *PoisonError for events that cannot be
// applied (its Reached is the version the document reflects, so the
// events up to it are done). An event only an earlier collection cannot
// apply is left to the verify-and-repair pass that precedes a switch
// when its document changed since the rebuild's scan wrote it
// (the rebuild's VerifySums), and otherwise to the stream's next event,
// whose gap is filled from the log, or to a verify job.
// With no collection of this version, the events are done (a build of
// this version scans the log after announcing its shadow). Errors:
// those of Collections, wrapped with the collection's name but for the
// last; then nothing is known to be written, in any collection, and every
// event must be applied again.
func ApplyAll(ctx context.Context, c Collections, v int, pointerAge time.Duration, events []domain.Event) (Outcome, map[string]error, error) {
	ptr, err := c.Pointer(ctx, pointerAge)
	if err != nil {
		return Outcome{}, nil, err
	}
	colls := ptr.Collections(v)
	var (
		out    Outcome
		poison map[string]error
	)
	for i, coll := range colls {
		o, pe, err := c.ApplyTo(ctx, coll, events)
		if i == len(colls)-1 {
			if err != nil {
				return o, pe, err
			}
			out, poison = o, pe
		} else if err != nil {
			return Outcome{}, nil, fmt.Errorf("%s: %w", coll, err)
		}
	}
	// A shadow announced while the batch was being written gets the
	// batch too, before its events are acknowledged. A rebuild's scan
	// starts after the announcement and reads every event appended before
	// it; so every event is in the scan or in the shadow, however long the
	// batch took, and a shadow document equal to what the scan recorded is
	// the fold of the log.
	now, err := c.Pointer(ctx, 0)
	if err != nil {
		return Outcome{}, nil, err
	}
	for _, coll := range now.Collections(v) {
		if !slices.Contains(colls, coll) {
			if _, _, err := c.ApplyTo(ctx, coll, events); err != nil {
				return Outcome{}, nil, fmt.Errorf("%s: %w", coll, err)
			}
		}
	}
	return out, poison, nil
}
