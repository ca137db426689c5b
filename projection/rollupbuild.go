package projection

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/pause"
)

// A rollup is built (on a store that never had this version, by a
// rebuild, or to verify it) in a shadow collection, without a
// transaction and without counting an event twice or missing one:
//
//   - Prepare starts the shadow's cursor where the relay has published up
//     to, and sets its cut a clock margin ahead. From then on the live
//     feed (Apply) counts in the shadow every event recorded after the
//     cut, and no other: an event recorded after the cut was published
//     after the cursor's position, so it reaches the shadow.
//   - The scan (WriteFolds), which starts a margin after the cut, counts
//     every event recorded up to the cut: each was committed by the time
//     the scan starts (the margin bounds how far the appending instances'
//     clocks disagree plus the longest append, as for the relay's
//     catch-up), so the scan reads it. It records each stream's
//     contribution (idempotent: a scan resumed from its cursor writes
//     them again), not sums.
//   - The finish (VerifySums) adds the recorded contributions to the
//     shadow's years, each year once (SalesYear.Merged), and waits
//     until the shadow's cursor has reached the active collection's, so
//     that a switch shows readers nothing older.

// Prepare starts shadow, the collection of a build: its cursor at where
// the relay has published up to, its cut a clock margin from now. It
// returns when the build's scan may start: a margin after the cut. A
// shadow already started keeps its cursor (a plan run again).
func (r *Rollup) Prepare(ctx context.Context, shadow string) (time.Time, error) {
	if cur, ok, err := r.store.Cursor(ctx, shadow); err != nil {
		return time.Time{}, err
	} else if ok {
		return cur.Cut.Add(r.margin), nil
	}
	pos, seq, err := r.published.Published(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: where the relay has published: %w", r.def.Name, err)
	}
	// Or where the active collection has counted up to, when further: the
	// relay's checkpoint lags its publishes, and the shadow's cursor moves
	// only with the live feed, so on an idle service a shadow started
	// behind the active collection would never reach it (waitCaughtUp).
	// Every event at or below either position was published, so recorded,
	// before now.
	if active, err := r.activeCursor(ctx, shadow); err != nil {
		return time.Time{}, err
	} else if active.Position > pos {
		pos, seq = active.Position, active.Seq
	}
	// To the millisecond, as the store keeps it.
	cur := RollupCursor{Position: pos, Seq: seq, Cut: time.Now().UTC().Add(r.margin).Truncate(time.Millisecond)}
	if err := r.store.SaveCursor(ctx, shadow, cur); err != nil {
		return time.Time{}, fmt.Errorf("%s: start %s: %w", r.def.Name, shadow, err)
	}
	return cur.Cut.Add(r.margin), nil
}

// WriteFolds records, for a build's scan, what each stream's events
// recorded up to coll's cut add to the daily sales (one Contribution per
// stream, on its placement's day and currency). A stream whose first
// event is not its placement, or that cannot be read (StreamEvents.Err),
// is counted as poison, its other events still counted when its placement
// is known. Errors: the store's; domain.ErrNotFound (wrapped) when coll
// has no cut (Prepare sets it).
func (r *Rollup) WriteFolds(ctx context.Context, coll string, streams []domain.StreamEvents) (FoldResult, error) {
	var res FoldResult
	cur, ok, err := r.store.Cursor(ctx, coll)
	if err != nil {
		return res, err
	}
	if !ok || cur.Cut.IsZero() {
		return res, fmt.Errorf("%s: %s has no cut: %w", r.def.Name, coll, domain.ErrNotFound)
	}
	var cs []Contribution
	for _, st := range streams {
		c, err := r.streamContribution(st, cur.Cut)
		res.fold(st, err)
		if c.Day != "" {
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return res, nil
	}
	if err := r.store.SaveContributions(ctx, coll, cs); err != nil {
		return res, fmt.Errorf("%s: record contributions in %s: %w", r.def.Name, SumsCollection(coll), err)
	}
	return res, nil
}

// streamContribution adds up what the events of one stream recorded up
// to cut add to the daily sales.
func (r *Rollup) streamContribution(st domain.StreamEvents, cut time.Time) (Contribution, error) {
	c := Contribution{Stream: st.StreamID}
	if len(st.Events) == 0 {
		return c, nil
	}
	p, ok := placedBy(st.Events[0])
	if !ok {
		return c, fmt.Errorf("%s: the first event of %s is %s, not its placement", r.def.Name, st.StreamID, st.Events[0].Type)
	}
	c.Day, c.Currency = p.Day, p.Currency
	for _, e := range st.Events {
		if s, ok := sales(e); ok && !e.RecordedAt.After(cut) {
			c.Sales.add(s)
		}
	}
	return c, nil
}

// catchUpWait bounds how long a build's finish waits for its shadow to
// reach the active collection's cursor; past it the finish fails and is
// run again later.
const catchUpWait = 2 * time.Minute

// VerifySums is the finish of a rollup's build: it adds the contributions
// its scan recorded to coll's years, each year once, and waits until
// coll's cursor has reached the active collection's (of any version: a
// first build waits for none). Its report counts the contributions
// (Streams) and the years written (Documents); a rollup's build has
// nothing to repair, its sums being exact by construction. progress (nil:
// none) is called every 500 contributions. Errors: the store's,
// progress's, and domain.ErrUnavailable (wrapped) when coll did not catch
// up within catchUpWait (the live feed does not run, or lost positions).
func (r *Rollup) VerifySums(ctx context.Context, coll string, _ bool, progress func(VerifyProgress) error) (VerifyReport, error) {
	v := &verifying{coll: coll, rep: VerifyReport{Collection: coll, Examples: []DriftExample{}}}
	years := map[string]*SalesYear{}
	err := r.store.EachContribution(ctx, coll, func(c Contribution) error {
		v.rep.Streams++
		id := YearID(c.Day, c.Currency)
		if years[id] == nil {
			years[id] = &SalesYear{Days: map[string]DaySales{}}
		}
		years[id].addDay(c.Day, c.Sales)
		return v.step(c.Stream, progress)
	})
	if err != nil {
		return v.rep, fmt.Errorf("verify %s: %w", SumsCollection(coll), err)
	}
	for _, id := range slices.Sorted(maps.Keys(years)) {
		// One compare-and-set write of the year, unless a finish of this
		// build merged it already (SalesYear.Merged).
		written, err := r.updateYear(ctx, coll, id, func(m *SalesYear) bool {
			if m.Merged == coll {
				return false
			}
			for day, s := range years[id].Days {
				m.addDay(day, s)
			}
			m.Merged = coll
			return true
		})
		if err != nil {
			return v.rep, err
		}
		if written {
			v.rep.Documents++
		}
	}
	if err := r.waitCaughtUp(ctx, coll); err != nil {
		return v.rep, err
	}
	return v.end(progress)
}

// waitCaughtUp waits until coll's cursor has reached the active
// collection's cursor as read now, up to catchUpWait.
func (r *Rollup) waitCaughtUp(ctx context.Context, coll string) error {
	target, err := r.activeCursor(ctx, coll)
	if err != nil || target.Position == 0 {
		return err
	}
	deadline := time.Now().Add(catchUpWait)
	for {
		cur, _, err := r.store.Cursor(ctx, coll)
		if err != nil {
			return err
		}
		if cur.Position >= target.Position {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s at log position %d, the active collection at %d after %v: %w", r.def.Name, coll, cur.Position, target.Position,
				catchUpWait, domain.ErrUnavailable)
		}
		if pause.For(ctx, 100*time.Millisecond); ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// activeCursor returns the cursor of the collection readers read, when it
// is a working collection of this version other than coll; else the zero
// cursor. Errors: the store's.
func (r *Rollup) activeCursor(ctx context.Context, coll string) (RollupCursor, error) {
	ptr, err := r.Pointer(ctx, 0)
	if err != nil || ptr.Active == "" || ptr.Active == coll || ptr.ActiveVer() != r.def.Ver() || ptr.Broken != "" {
		return RollupCursor{}, err
	}
	cur, _, err := r.store.Cursor(ctx, ptr.Active)
	return cur, err
}

// Compare compares coll, a build's shadow caught up with active, with
// active, day by day: each day and currency whose sums differ is drift
// ("different"; "missing" when active has no sums for it, "extra" when
// coll has none). The two collections are read while their cursors stand
// still at one position (both fed by the same live batches), read again
// until they do. Errors: the store's; domain.ErrUnavailable (wrapped)
// when the cursors kept moving apart for catchUpWait.
func (r *Rollup) Compare(ctx context.Context, coll, active string) (VerifyReport, error) {
	rep := VerifyReport{Collection: active, Examples: []DriftExample{}}
	deadline := time.Now().Add(catchUpWait)
	for {
		before, err := r.positions(ctx, active, coll)
		if err != nil {
			return rep, err
		}
		if before[0] == before[1] { // else read again after the pause, not the years
			a, err := r.store.Years(ctx, active, "", "~")
			if err != nil {
				return rep, err
			}
			b, err := r.store.Years(ctx, coll, "", "~")
			if err != nil {
				return rep, err
			}
			after, err := r.positions(ctx, active, coll)
			if err != nil {
				return rep, err
			}
			if after == before {
				r.diff(&rep, a, b, int64(before[0]))
				return rep, nil
			}
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("%s: %s and %s never at one position within %v: %w", r.def.Name, active, coll, catchUpWait, domain.ErrUnavailable)
		}
		if pause.For(ctx, 50*time.Millisecond); ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
}

// positions returns the positions of the cursors of a and of b.
func (r *Rollup) positions(ctx context.Context, a, b string) ([2]uint64, error) {
	ca, _, err := r.store.Cursor(ctx, a)
	if err != nil {
		return [2]uint64{}, err
	}
	cb, _, err := r.store.Cursor(ctx, b)
	return [2]uint64{ca.Position, cb.Position}, err
}

// diff reports in rep each day and currency whose sums differ between
// active's years and the built ones, and the digests of both.
func (r *Rollup) diff(rep *VerifyReport, active, built []SalesYear, pos int64) {
	digest := func(days map[string]DaySales) string {
		var d Digest
		for _, s := range days {
			h, _ := DocHash(s)
			d.Add(h)
		}
		return d.String()
	}
	have, want := salesDays(active, "", "~", ""), salesDays(built, "", "~", "")
	rep.Documents, rep.Streams, rep.Events = int64(len(have)), int64(len(want)), pos
	rep.Digest, rep.ExpectedDigest = digest(have), digest(want)
	all := maps.Clone(have)
	maps.Copy(all, want)
	for _, k := range slices.Sorted(maps.Keys(all)) {
		h, inHave := have[k]
		w, inWant := want[k]
		switch {
		case !inHave:
			rep.add(DriftExample{ID: k, Kind: "missing"})
		case !inWant:
			rep.add(DriftExample{ID: k, Kind: "extra"})
		case h != w:
			rep.add(DriftExample{ID: k, Kind: "different", Fields: DiffFields(h, w)})
		}
	}
}
