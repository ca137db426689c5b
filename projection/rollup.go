package projection

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/orderd/orderd/domain"
)

// RollupDefinition describes a rollup: a projection of every stream into a
// few documents of sums, fed with the events in the order the relay
// published them (their log positions, Delivery.Position).
type RollupDefinition struct {
	Name       string
	Collection string
	// Version is the definition's own version (0 counts as 1), bumped when
	// what it sums or its documents' shape changes (see Definition).
	Version int
}

// Ver is the definition's version, at least 1.
func (d RollupDefinition) Ver() int { return max(d.Version, 1) }

// Key names what belongs to one version of the rollup: its consumer and
// the prefix of its rebuilt collections.
func (d RollupDefinition) Key() string { return VersionKey(d.Name, d.Ver()) }

// DailySales is the daily_sales rollup: per UTC day of placement and
// currency, the orders placed, their items, gross (their lines' prices)
// and freight, and how many of them are now canceled or unavailable; one
// document per year and currency (SalesYear), so ten years' answer reads
// ten documents a currency. Version 1 was a read model of one document per
// order, which this version replaces.
var DailySales = RollupDefinition{Name: "daily_sales", Collection: "daily_sales", Version: 2}

// SalesYear is a document of the daily sales: one year's days in one
// currency, and how far the log has been applied to it.
type SalesYear struct {
	ID       string              // YearID of Year and Currency
	Year     string              // YYYY
	Currency string              // ISO 4217
	Days     map[string]DaySales // by day, YYYY-MM-DD
	// Position is the log position of the last event applied: every event
	// of this document at or below it is counted, none above it.
	Position uint64
	// Merged is the build whose scan's sums were added to the document
	// (at most once); "" when none.
	Merged string
	// Retried are the dead letters whose events were counted later, by a
	// retry (each at most once).
	Retried []string
	// Rev counts the year's writes: every write is a compare-and-set on
	// it (RollupStore.SaveYear).
	Rev uint64
}

// DaySales is one day's sums in one currency.
type DaySales struct {
	Orders, Items, GrossCents, FreightCents, Canceled, Unavailable int64
}

// addDay adds s to the sums of day.
func (m *SalesYear) addDay(day string, s DaySales) {
	d := m.Days[day]
	d.add(s)
	m.Days[day] = d
}

func (d *DaySales) add(o DaySales) {
	d.Orders += o.Orders
	d.Items += o.Items
	d.GrossCents += o.GrossCents
	d.FreightCents += o.FreightCents
	d.Canceled += o.Canceled
	d.Unavailable += o.Unavailable
}

// YearID is the id of the SalesYear of day (YYYY-MM-DD) in currency:
// "YYYY|<currency>". Ids sort by year, so a range of years is a range of
// ids.
func YearID(day, currency string) string { return day[:4] + "|" + currency }

// Delivery is one message of the event stream as a rollup takes it: the
// event (or why it does not decode), its log position (the relay's count
// of the events it published, 0 when the message has none: a replay) and
// its stream sequence.
type Delivery struct {
	Event    domain.Event
	Err      error
	Position uint64
	Seq      uint64
}

// RollupCursor is how far a rollup collection has applied the log: every
// event at or below Position (whose message is at stream sequence Seq).
// Events recorded at or before Cut are not applied to it: a build's scan
// counted them (zero: none is skipped).
type RollupCursor struct {
	Position uint64
	Seq      uint64
	Cut      time.Time
}

// GapError says that the events before Delivery.Position were not given:
// positions From to To (stream sequences after AfterSeq and before
// BeforeSeq) must be applied first. The caller reads them from the stream
// and applies them with the rest.
type GapError struct {
	Collection string
	From, To   uint64
	AfterSeq   uint64
	BeforeSeq  uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("%s: log positions %d to %d not delivered (stream sequences %d to %d)", e.Collection, e.From, e.To, e.AfterSeq+1, e.BeforeSeq-1)
}

// RollupStore is the storage of a rollup's collections; the MongoDB
// adapter's *mongodb.Rollups implements it. Its errors are
// domain.ErrUnavailable when the store cannot be reached.
type RollupStore interface {
	// LoadYear returns year id of coll; false when it has none.
	LoadYear(ctx context.Context, coll, id string) (SalesYear, bool, error)
	// SaveYear writes m in coll in place of the year stored at revision
	// m.Rev-1 (where there is none, for m.Rev 1): a compare-and-set. It
	// reports false when the stored year is not the one read.
	SaveYear(ctx context.Context, coll string, m SalesYear) (bool, error)
	// Years returns coll's years whose ids are from to to, both
	// included, sorted by id.
	Years(ctx context.Context, coll, from, to string) ([]SalesYear, error)
	// Cursor returns coll's cursor; false when it has none (a shadow not
	// started yet).
	Cursor(ctx context.Context, coll string) (RollupCursor, bool, error)
	// SaveCursor stores c as coll's cursor over a lower position only (or
	// where there is none).
	SaveCursor(ctx context.Context, coll string, c RollupCursor) error
	// SaveContributions records what a build's scan counted of each
	// stream, replacing those of the same streams.
	SaveContributions(ctx context.Context, coll string, cs []Contribution) error
	// EachContribution calls fn with every contribution recorded for coll.
	EachContribution(ctx context.Context, coll string, fn func(Contribution) error) error
}

// Contribution is what a stream's events add to the daily sales, on the
// day and currency of the order's placement.
type Contribution struct {
	Stream   string
	Day      string
	Currency string
	Sales    DaySales
}

// Positions is where the relay has published up to: the log position and
// stream sequence of its checkpoint. A rollup's build starts its shadow
// there.
type Positions interface {
	Published(ctx context.Context) (position, seq uint64, err error)
}

// Rollup is a rollup as the service runs it: its definition, the pointer
// to its collections, and the fold of a run of deliveries into them. The
// storage is RollupStore's.
type Rollup struct {
	def       RollupDefinition
	store     RollupStore
	log       Log
	metrics   *Metrics
	pointers  Pointers
	published Positions
	margin    time.Duration
	placed    *lru.Cache[string, placement]
	lost      sync.Map // collections whose positions were lost (Lost), to true
}

// placement is the day and currency an order was placed on and in.
type placement struct{ day, currency string }

// NewRollup returns the rollup def kept in store, its pointer read
// through ps, reading the orders' placements from log; published says
// where a build's shadow starts, and margin is how far the instances'
// clocks may disagree plus the longest append (a build counts the events
// recorded up to a cut in its scan, and scans margin after the cut). m
// may be nil.
func NewRollup(def RollupDefinition, store RollupStore, log Log, m *Metrics, ps Pointers, published Positions, margin time.Duration) *Rollup {
	c, _ := lru.New[string, placement](cacheSize)
	m.Init(def.Name)
	return &Rollup{def: def, store: store, log: log, metrics: m, pointers: ps, published: published, margin: margin,
		placed: c}
}

// Name is the rollup's name.
func (r *Rollup) Name() string { return r.def.Name }

// Version is the version of the definition this process folds.
func (r *Rollup) Version() int { return r.def.Ver() }

// Collection is the definition's base collection.
func (r *Rollup) Collection() string { return r.def.Collection }

// Pointer returns the rollup's pointer, at most maxAge old.
func (r *Rollup) Pointer(ctx context.Context, maxAge time.Duration) (Pointer, error) {
	return r.pointers.Get(ctx, r.def.Name, r.def.Collection, maxAge)
}

// EnsureIndexes has nothing to create: a rollup is read by _id.
func (r *Rollup) EnsureIndexes(context.Context) error { return nil }

// contribution returns what event e adds to the daily sales, and false
// when it adds nothing. Errors: the log's, reading the placement of an
// order canceled or marked unavailable (which its event does not carry),
// wrapped; domain.ErrNotFound (wrapped) when the log has no placement of
// that order.
func (r *Rollup) contribution(ctx context.Context, e domain.Event) (Contribution, bool, error) {
	if c, ok := placedBy(e); ok {
		return c, true, nil
	}
	s, ok := sales(e)
	if !ok {
		return Contribution{}, false, nil
	}
	p, err := r.placement(ctx, e.StreamID)
	if err != nil {
		return Contribution{}, false, err
	}
	return Contribution{Stream: e.StreamID, Day: p.day, Currency: p.currency, Sales: s}, true, nil
}

// sales returns what event e adds to the daily sales of its order's
// placement day and currency, and false when it adds nothing: the live
// feed (contribution) and a build's scan (streamContribution) count
// through it alike.
func sales(e domain.Event) (DaySales, bool) {
	switch e.Type {
	case domain.TypeOrderCanceled:
		return DaySales{Canceled: 1}, true
	case domain.TypeOrderMarkedUnavailable:
		return DaySales{Unavailable: 1}, true
	}
	c, ok := placedBy(e)
	return c.Sales, ok
}

// placedBy returns what e adds when it places an order, and false when
// it does not (the decoder gives payloads as values, not pointers).
func placedBy(e domain.Event) (Contribution, bool) {
	d, ok := e.Data.(domain.OrderPlaced)
	if !ok {
		return Contribution{}, false
	}
	o := domain.Order{}
	_ = o.Apply(domain.Event{StreamID: e.StreamID, Type: e.Type, Version: 1, OccurredAt: e.OccurredAt, Data: d})
	return Contribution{Stream: e.StreamID, Day: SaleDay(e.OccurredAt), Currency: d.Currency,
		Sales: DaySales{Orders: 1, Items: o.ItemCount, GrossCents: o.SubtotalCents, FreightCents: o.FreightCents}}, true
}

// placement returns the day and currency of an order's placement, read
// from its stream's first event and cached.
func (r *Rollup) placement(ctx context.Context, stream string) (placement, error) {
	if p, ok := r.placed.Get(stream); ok {
		return p, nil
	}
	evs, err := r.log.LoadFrom(ctx, stream, 1)
	if err != nil {
		return placement{}, fmt.Errorf("placement of %s: %w", stream, err)
	}
	if len(evs) == 0 || evs[0].Version != 1 {
		return placement{}, fmt.Errorf("placement of %s: %w", stream, domain.ErrNotFound)
	}
	c, ok := placedBy(evs[0])
	if !ok {
		return placement{}, fmt.Errorf("placement of %s: its first event is %s: %w", stream, evs[0].Type, domain.ErrNotFound)
	}
	p := placement{c.Day, c.Currency}
	r.placed.Add(stream, p)
	return p, nil
}

// Apply applies a run of deliveries, sorted by stream sequence, to every
// collection of this version the pointer names (a build's shadow first,
// then the collection a switch replaced, then the active one). Each
// collection takes the events past its cursor, which must follow on from
// it: a *GapError names the positions missing, to be read from the stream
// and given with the rest. Deliveries without a position (a replay) are
// passed over. It returns the deliveries, by index, that cannot be
// counted (a message that does not decode, an order whose placement the
// log does not hold): the collections pass over them, and the caller
// parks them. Errors: a *GapError, or one that may pass (the store or the
// log cannot be reached), after which any collection may or may not have
// been written and the run must be given again.
func (r *Rollup) Apply(ctx context.Context, ds []Delivery) (Outcome, map[int]error, error) {
	ptr, err := r.Pointer(ctx, WriterPointerAge)
	if err != nil {
		return Outcome{}, nil, err
	}
	var colls []string
	if ptr.Generation > 0 {
		// Without a pointer document (Pointers.Ensure writes the
		// first), the base collection may be a former version's.
		colls = ptr.Collections(r.def.Ver())
	}
	counted := make([]*Contribution, len(ds))
	poison := map[int]error{}
	for i, d := range ds {
		if d.Position == 0 {
			continue
		}
		if d.Err != nil {
			poison[i] = d.Err
			continue
		}
		c, ok, err := r.contribution(ctx, d.Event)
		switch {
		case err != nil && Passes(err):
			return Outcome{}, nil, err
		case err != nil:
			poison[i] = err
		case ok:
			counted[i] = &c
		}
	}
	var (
		out Outcome
		gap error // the first collection's gap; the others go on
	)
	for _, coll := range colls {
		if _, lost := r.lost.Load(coll); lost || (coll == ptr.Active && ptr.Broken != "") {
			continue
		}
		o, err := r.applyTo(ctx, coll, ds, counted)
		if _, isGap := errors.AsType[*GapError](err); isGap {
			if gap == nil {
				gap = err
			}
			continue
		} else if err != nil {
			return Outcome{}, nil, err
		}
		out = o
	}
	r.metrics.Record(r.def.Name, out)
	return out, poison, gap
}

// Lost sets aside the collection of gap, whose log positions are neither
// delivered nor in the stream: this process applies nothing more to it,
// and when readers read it the pointer says it is broken
// (Pointer.Broken), which readers then leave aside and a build of this
// version repairs. Errors: the pointer's write.
func (r *Rollup) Lost(ctx context.Context, gap *GapError) error {
	r.lost.Store(gap.Collection, true)
	_, err := r.pointers.Update(ctx, r.def.Name, r.def.Collection, func(p *Pointer) (bool, error) {
		if p.Active != gap.Collection || p.Broken != "" {
			return false, nil
		}
		p.Broken = fmt.Sprintf("%s: %v", ErrPositionsLost, gap)
		return true, nil
	})
	return err
}

// Recount counts the events of dead letter id once in the collection
// readers read (SalesYear.Retried keeps it from counting twice). Errors:
// domain.ErrNotBuilt, the contribution's (the placement still missing),
// the store's.
func (r *Rollup) Recount(ctx context.Context, id string, evs []domain.Event) error {
	ptr, err := r.Pointer(ctx, 0)
	if err != nil {
		return err
	}
	if ptr.Active == "" || ptr.ActiveVer() != r.def.Ver() {
		return fmt.Errorf("%s: %w", r.def.Name, domain.ErrNotBuilt)
	}
	for _, e := range evs {
		c, ok, err := r.contribution(ctx, e)
		if err == nil && ok {
			// One compare-and-set write of the year, unless it counted
			// the dead letter already.
			_, err = r.updateYear(ctx, ptr.Active, YearID(c.Day, c.Currency), func(m *SalesYear) bool {
				if slices.Contains(m.Retried, id) {
					return false
				}
				m.addDay(c.Day, c.Sales)
				m.Retried = append(m.Retried, id)
				return true
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// applyTo applies to coll the run of ds past its cursor: the deliveries
// of consecutive positions from the cursor on, the others being
// duplicates. Those recorded after the cursor's cut count: one
// compare-and-set write per year they add to, then the cursor, moved to
// the run's end. A collection without a cursor (a shadow its build has
// not started) takes nothing. Errors: a *GapError at the first position
// that does not follow on, the store's.
func (r *Rollup) applyTo(ctx context.Context, coll string, ds []Delivery, counted []*Contribution) (Outcome, error) {
	// The cursor is read from the store at each run: another process may
	// have moved it (a pin that moved).
	cur, ok, err := r.store.Cursor(ctx, coll)
	if err != nil || (!ok && coll != r.def.Collection) {
		return Outcome{}, err
	}
	// The base collection without a cursor is of this version only when
	// the log was empty as the pointer was first written (Pointers.Ensure):
	// it starts at the log's first position.
	var out Outcome
	last, byYear := cur, map[string][]int{}
	for i, d := range ds {
		switch {
		case d.Position == 0 || d.Position <= last.Position:
			out.Duplicates++
			continue
		case d.Position != last.Position+1:
			return out, &GapError{Collection: coll, From: last.Position + 1, To: d.Position - 1, AfterSeq: last.Seq, BeforeSeq: d.Seq}
		}
		last.Position, last.Seq = d.Position, d.Seq
		c := counted[i]
		if c == nil || (!cur.Cut.IsZero() && !d.Event.RecordedAt.After(cur.Cut)) {
			continue
		}
		id := YearID(c.Day, c.Currency)
		byYear[id] = append(byYear[id], i)
		out.Applied++
	}
	if last.Position == cur.Position {
		return out, nil // nothing past the cursor
	}
	for _, id := range slices.Sorted(maps.Keys(byYear)) {
		// One compare-and-set write of the year: what its deliveries (in
		// position order) add past its position.
		idx := byYear[id]
		_, err := r.updateYear(ctx, coll, id, func(m *SalesYear) bool {
			changed := false
			for _, i := range idx {
				if ds[i].Position <= m.Position {
					continue // counted by another writer
				}
				m.addDay(counted[i].Day, counted[i].Sales)
				changed = true
			}
			m.Position = ds[idx[len(idx)-1]].Position
			return changed
		})
		if err != nil {
			return Outcome{}, err
		}
	}
	if err := r.store.SaveCursor(ctx, coll, last); err != nil {
		return Outcome{}, fmt.Errorf("%s: cursor of %s: %w", r.def.Name, coll, err)
	}
	return out, nil
}

// maxSaveTries bounds the compare-and-set writes of a year that another
// writer keeps changing.
const maxSaveTries = 10

// updateYear lets change edit year id of coll (a new one when it is not
// stored) and writes it, a compare-and-set on its revision, read again
// and changed again when another writer moved it in between. change
// returns false when the year needs no write. It reports whether it
// wrote.
func (r *Rollup) updateYear(ctx context.Context, coll, id string, change func(m *SalesYear) bool) (bool, error) {
	for range maxSaveTries {
		m, exists, err := r.store.LoadYear(ctx, coll, id)
		if err != nil {
			return false, fmt.Errorf("%s: read %s of %s: %w", r.def.Name, id, coll, err)
		}
		if !exists {
			m = SalesYear{ID: id, Year: id[:4], Currency: id[5:]}
		}
		if m.Days == nil {
			m.Days = map[string]DaySales{}
		}
		if !change(&m) {
			return false, nil
		}
		m.Rev++
		ok, err := r.store.SaveYear(ctx, coll, m)
		if err != nil {
			return false, fmt.Errorf("%s: write %s of %s: %w", r.def.Name, id, coll, err)
		}
		if ok {
			return true, nil
		}
	}
	return false, fmt.Errorf("%s: write %s of %s: changed by another writer %d times: %w", r.def.Name, id, coll, maxSaveTries, domain.ErrUnavailable)
}

// Sales returns the daily sales readers read over the UTC dates of from
// to to (both included; the time of day is ignored), of one currency when
// currency is not empty: one row per day and currency with sales, sorted
// by day then currency, read from the years of the range. Errors:
// domain.ErrNotBuilt before a first build has switched to a collection of
// this version, domain.ErrUnavailable.
func (r *Rollup) Sales(ctx context.Context, from, to time.Time, currency string) ([]domain.DailySales, error) {
	ptr, err := r.pointers.Last(ctx, r.def.Name, r.def.Collection, ReaderPointerAge)
	if err != nil {
		return nil, err
	}
	if ptr.Active == "" || ptr.ActiveVer() != r.def.Ver() || ptr.Broken != "" {
		return nil, fmt.Errorf("%s: %w", r.def.Name, domain.ErrNotBuilt)
	}
	first, last := SaleDay(from), SaleDay(to)
	years, err := r.store.Years(ctx, ptr.Active, first[:4]+"|", last[:4]+"|~")
	if err != nil {
		return nil, fmt.Errorf("%s: years %s to %s: %w", r.def.Name, first[:4], last[:4], err)
	}
	return salesRows(salesDays(years, first, last, currency)), nil
}

// salesDays returns the days of years from first to last (YYYY-MM-DD,
// both included) in currency ("": every one) whose sums are not all zero,
// keyed "<day>|<currency>".
func salesDays(years []SalesYear, first, last, currency string) map[string]DaySales {
	out := map[string]DaySales{}
	for _, m := range years {
		if currency != "" && m.Currency != currency {
			continue
		}
		for day, s := range m.Days {
			if day >= first && day <= last && s != (DaySales{}) {
				out[day+"|"+m.Currency] = s
			}
		}
	}
	return out
}

// ErrPositionsLost says that a rollup cannot go on: log positions it has
// not applied are neither delivered nor in the stream (the stream lost
// them, or the relay caught up from the log and started its positions
// anew). Only a build from the log repairs it.
var ErrPositionsLost = errors.New("log positions lost")
