package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/orderd/orderd/domain"
)

// Log is what a projection reads of the event log: the events of a
// stream from version from on, in version order, to fill a gap. Its
// errors wrap domain.ErrUnreadableCommit for a commit the log holds but
// this build cannot read, domain.ErrUnavailable when the store cannot be
// reached.
type Log interface {
	LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error)
}

// Step is what Advance made of one stream's delivered events: the
// document to store when Events > 0 (that many events were folded into
// it), and a PoisonError when events after those cannot be applied.
type Step[D any] struct {
	Doc    D
	Events int
	Poison *PoisonError
}

// Advance brings doc, the stored document of stream id (zero if none),
// up to the highest version among evs, the stream's delivered events (any
// order, duplicates allowed; evs is sorted in place). Events at or below
// the document's version are skipped (Outcome.Duplicates); when the rest
// do not follow on from it, the gap is read from log (Outcome.GapsFilled).
//
// An event Apply refuses, a gap the log does not cover, or a gap read the
// log answers with an error that will not pass (domain.ErrUnreadableCommit)
// is poison: the step keeps the events folded before it and says so in
// Step.Poison, whose Reached is the version the step's document reflects.
// The error returned is only one that may pass on a redelivery (Passes):
// the store cannot be reached, or ctx is done; then there is nothing to
// store.
func (d Definition[D]) Advance(ctx context.Context, log Log, id string, doc D, evs []domain.Event) (Step[D], Outcome, error) {
	var (
		step Step[D]
		out  Outcome
	)
	if len(evs) == 0 {
		return step, out, nil
	}
	slices.SortFunc(evs, func(a, b domain.Event) int { return cmp.Compare(a.Version, b.Version) })
	evs = slices.CompactFunc(evs, func(a, b domain.Event) bool { return a.Version == b.Version })
	from, want := d.StreamVersion(&doc), evs[len(evs)-1].Version
	next := slices.DeleteFunc(slices.Clone(evs), func(e domain.Event) bool { return e.Version <= from })
	out.Duplicates = len(evs) - len(next)
	if len(next) == 0 {
		return step, out, nil
	}
	if !contiguous(next, from+1) {
		var err error
		if next, err = log.LoadFrom(ctx, id, from+1); err != nil {
			err = fmt.Errorf("fill gap of %s after v%d: %w", id, from, err)
			if Passes(err) {
				return step, out, err
			}
			// The same read fails the same way on every redelivery (a
			// commit of a newer writer: domain.ErrUnreadableCommit):
			// poison, not retried for ever.
			step.Poison = &PoisonError{Reached: from, Err: err}
			return step, out, nil
		}
		out.GapsFilled++
		if !contiguous(next, from+1) || len(next) == 0 || next[len(next)-1].Version < want {
			step.Poison = &PoisonError{Reached: from, Err: fmt.Errorf("fill gap of %s after v%d: the log does not hold v%d", id, from, want)}
			return step, out, nil
		}
	}
	step.Doc = doc
	for _, e := range next {
		if err := d.Apply(&step.Doc, e); err != nil {
			// Keep what applied: the events before the bad one are good,
			// and the document holds exactly them (Apply changes nothing
			// on error).
			step.Poison = &PoisonError{Reached: d.StreamVersion(&step.Doc),
				Err: fmt.Errorf("%s: apply %s v%d of %s: %w", d.Name, e.Type, e.Version, id, err)}
			return step, out, nil
		}
		step.Events++
	}
	return step, out, nil
}

// Passes reports whether an error of a log read may pass on a redelivery:
// the store cannot be reached, or the caller is stopping. Anything else
// the log answers it will answer again.
func Passes(err error) bool {
	return errors.Is(err, domain.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// contiguous reports whether evs are versions from, from+1, ...
func contiguous(evs []domain.Event, from int64) bool {
	for i, e := range evs {
		if e.Version != from+int64(i) {
			return false
		}
	}
	return true
}
