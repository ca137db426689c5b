package projection

import "fmt"

// ApplyAll writes a delivery of events (any streams, any order, duplicates
// allowed), through applyTo, into every collection of version v that ptr
// (read once for the delivery, at most WriterPointerAge old) names;
// applyTo advances the documents of the events' streams in one collection
// (Definition.Advance) and stores them. A rebuild's shadow goes first,
// then the previous collection (kept for a switch back), then the active
// one, so that during a rebuild the shadow is never behind the active
// collection on any document this process touched (the switch then never
// shows a reader an older version). Collections of other versions are
// left to the processes that fold those.
//
// One read of the pointer is enough: a rebuild's scan starts a settling
// time (longer than WriterPointerAge) after it announced its shadow and
// reads every event appended before it starts, and a batch's events were
// all appended before the batch read the pointer. So an event the scan
// does not read was appended after the scan started, and a batch holding
// it read a pointer that names the shadow.
//
// The results are those of the last collection written (the active one
// when it is of this version), as applyTo gives them: what it did, and
// per stream a *PoisonError for events that cannot be applied (its
// Reached is the version the document reflects, so the events up to it
// are done). An event only an earlier collection cannot apply is left to
// the verify-and-repair pass that precedes a switch when its document
// changed since the rebuild's scan wrote it (the rebuild's VerifySums),
// and otherwise to the stream's next event, whose gap is filled from the
// log, or to a verify job. With no collection of this version, the events
// are done (a build of this version scans the log after announcing its
// shadow). Errors: applyTo's (domain.ErrUnavailable, ctx's), wrapped with
// the collection's name but for the last; then nothing is known to be
// written, in any collection, and every event must be applied again.
func ApplyAll(ptr Pointer, v int, applyTo func(coll string) (Outcome, map[string]error, error)) (Outcome, map[string]error, error) {
	colls := ptr.Collections(v)
	var (
		out    Outcome
		poison map[string]error
	)
	for i, coll := range colls {
		o, pe, err := applyTo(coll)
		if i == len(colls)-1 {
			if err != nil {
				return o, pe, err
			}
			out, poison = o, pe
		} else if err != nil {
			return Outcome{}, nil, fmt.Errorf("%s: %w", coll, err)
		}
	}
	return out, poison, nil
}
