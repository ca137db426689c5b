package projection_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// salesLog is a log of orders placed over several years in two
// currencies, through every end of the lifecycle, and the stream the
// relay would make of it: each event once, at log positions 1..n and
// stream sequences 1..n, in commit order.
type salesLog struct {
	es     *mongodb.EventStore
	db     *mongo.Database
	want   []domain.DailySales
	first  time.Time
	last   time.Time
	stream []projection.Delivery
	ids    []string
}

func newSalesLog(t *testing.T, ctx context.Context, orders int) *salesLog {
	t.Helper()
	es, db := storetest.OpenStore(t)
	l := &salesLog{es: es, db: db}
	l.add(t, ctx, orders)
	return l
}

// add appends n more orders to the log, and their events to the stream.
func (l *salesLog) add(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	base := time.Date(2023, 12, 10, 22, 0, 0, 0, time.UTC) // across a year's end
	var ids []string
	for i := range len(l.ids) + n {
		id := fmt.Sprintf("sale%03d", i)
		if i >= len(l.ids) {
			// 53 hours apart: days, months and years, and placements near
			// midnight.
			projectiontest.AppendStream(t, ctx, l.es, id, projectiontest.Lifecycle(i, fmt.Sprintf("cust-%d", i%5)), 1+i%2,
				base.Add(time.Duration(i)*53*time.Hour))
		}
		ids = append(ids, id)
	}
	f := projectiontest.LoadFixture(t, ctx, l.es, ids)
	var first, last string
	l.want, first, last = f.ExpectedDailySales()
	l.first, _ = time.Parse(time.DateOnly, first)
	l.last, _ = time.Parse(time.DateOnly, last)
	for i, e := range f.Flat {
		if n := uint64(i + 1); i >= len(l.stream) {
			l.stream = append(l.stream, projection.Delivery{Event: e, Position: n, Seq: n})
		}
	}
	l.ids = ids
}

// rollupOn returns a Rollup on db's store, as one process runs it, whose
// active collection starts at the log's first position.
func rollupOn(t *testing.T, ctx context.Context, db *mongo.Database, es *mongodb.EventStore, store projection.RollupStore) *projection.Rollup {
	t.Helper()
	ps := mongodb.NewPointers(db)
	def := projection.DailySales
	if _, err := ps.Update(ctx, def.Name, def.Collection, func(p *projection.Pointer) (bool, error) {
		if p.Active == def.Collection && p.ActiveVersion == def.Ver() {
			return false, nil
		}
		p.Active, p.ActiveVersion = def.Collection, def.Ver()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := mongodb.NewRollups(db).SaveCursor(ctx, def.Collection, projection.RollupCursor{}); err != nil {
		t.Fatal(err)
	}
	return projection.NewRollup(def, store, es, nil, ps, nil, time.Second)
}

// feed applies batch to r as the projector does: a gap it names is read
// from the stream (the deliveries at the sequences it names) and applied
// with the batch.
func (l *salesLog) feed(ctx context.Context, r *projection.Rollup, batch []projection.Delivery) error {
	run := slices.Clone(batch)
	slices.SortFunc(run, func(a, b projection.Delivery) int { return int(a.Seq) - int(b.Seq) })
	for range 100 {
		_, poison, err := r.Apply(ctx, run)
		var gap *projection.GapError
		if !errors.As(err, &gap) {
			if len(poison) > 0 {
				return fmt.Errorf("poison: %v", poison)
			}
			return err
		}
		for _, d := range l.stream {
			if d.Seq > gap.AfterSeq && d.Seq < gap.BeforeSeq {
				run = append(run, d)
			}
		}
		slices.SortFunc(run, func(a, b projection.Delivery) int { return int(a.Seq) - int(b.Seq) })
		run = slices.CompactFunc(run, func(a, b projection.Delivery) bool { return a.Seq == b.Seq })
	}
	_, _, err := r.Apply(ctx, run)
	return fmt.Errorf("gaps never filled: %w", err)
}

// batches cuts the stream into runs of n deliveries.
func (l *salesLog) batches(n int) [][]projection.Delivery {
	var out [][]projection.Delivery
	for s := l.stream; len(s) > 0; s = s[min(n, len(s)):] {
		out = append(out, s[:min(n, len(s))])
	}
	return out
}

func (l *salesLog) check(t *testing.T, ctx context.Context, r *projection.Rollup) {
	t.Helper()
	got, err := r.Sales(ctx, l.first, l.last, "")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l.want) {
		t.Errorf("daily sales\n got %s\nwant %s", projectiontest.Dump(got), projectiontest.Dump(l.want))
	}
	eur, err := r.Sales(ctx, l.first, l.last, "EUR")
	if err != nil {
		t.Fatal(err)
	}
	var want []domain.DailySales
	for _, d := range l.want {
		if d.Currency == "EUR" {
			want = append(want, d)
		}
	}
	if !reflect.DeepEqual(eur, want) {
		t.Errorf("daily sales in EUR\n got %s\nwant %s", projectiontest.Dump(eur), projectiontest.Dump(want))
	}
}

// TestRollupCountsEveryEventOnce: whatever the deliveries (each twice,
// batches in reverse order, two processes at once, copies of events
// published again under their positions, a process that dies between its
// writes), the daily sales equal the sums computed from the log, canceled
// and unavailable orders on the day and in the currency of their
// placement, which their events do not carry.
func TestRollupCountsEveryEventOnce(t *testing.T) {
	ctx := projectiontest.Context(t, 3*time.Minute)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, l *salesLog)
	}{
		{"each delivery twice", func(t *testing.T, l *salesLog) {
			r := rollupOn(t, ctx, l.db, l.es, mongodb.NewRollups(l.db))
			for _, b := range l.batches(7) {
				for range 2 {
					if err := l.feed(ctx, r, b); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := l.feed(ctx, r, l.stream); err != nil {
				t.Fatal(err)
			}
			l.check(t, ctx, r)
		}},
		{"batches in reverse order", func(t *testing.T, l *salesLog) {
			r := rollupOn(t, ctx, l.db, l.es, mongodb.NewRollups(l.db))
			bs := l.batches(5)
			slices.Reverse(bs)
			for _, b := range bs {
				if err := l.feed(ctx, r, b); err != nil {
					t.Fatal(err)
				}
			}
			l.check(t, ctx, r)
		}},
		{"two processes at once", func(t *testing.T, l *salesLog) {
			a := rollupOn(t, ctx, l.db, l.es, mongodb.NewRollups(l.db))
			other := storetest.Client(t).Database(l.db.Name())
			b := projection.NewRollup(projection.DailySales, mongodb.NewRollups(other), mongodb.NewEventStore(other), nil,
				mongodb.NewPointers(other), nil, time.Second)
			var wg sync.WaitGroup
			for i, r := range []*projection.Rollup{a, b} {
				wg.Go(func() {
					bs := l.batches(3 + 4*i)
					if i == 1 {
						slices.Reverse(bs)
					}
					for _, batch := range bs {
						if err := l.feed(ctx, r, batch); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			l.check(t, ctx, a)
		}},
		{"copies published again", func(t *testing.T, l *salesLog) {
			r := rollupOn(t, ctx, l.db, l.es, mongodb.NewRollups(l.db))
			// Each event's copy, stored after the original under its
			// position, as a relay publishing again from its checkpoint
			// after JetStream's de-duplication window leaves it; and a
			// replay's copies, with no position.
			n := uint64(len(l.stream))
			var copies []projection.Delivery
			for i, d := range l.stream {
				c := d
				c.Seq = n + uint64(i) + 1
				if i%2 == 1 {
					c.Position = 0
				}
				copies = append(copies, c)
			}
			l.stream = append(l.stream, copies...)
			for _, b := range l.batches(9) {
				if err := l.feed(ctx, r, b); err != nil {
					t.Fatal(err)
				}
			}
			l.check(t, ctx, r)
		}},
		{"a process dies between its writes", func(t *testing.T, l *salesLog) {
			store := &dying{RollupStore: mongodb.NewRollups(l.db), left: -1}
			r := rollupOn(t, ctx, l.db, l.es, store)
			deaths := 0
			for k, b := range l.batches(11) {
				if k%2 == 1 {
					store.dieAfter(1)
				}
				if err := l.feed(ctx, r, b); err != nil && !errors.Is(err, errDied) {
					t.Fatal(err)
				}
				if store.died() {
					deaths++
					// The process is gone; the next one starts from
					// what the store holds.
					store = &dying{RollupStore: mongodb.NewRollups(l.db), left: -1}
					r = projection.NewRollup(projection.DailySales, store, l.es, nil, mongodb.NewPointers(l.db), nil, time.Second)
				}
			}
			if deaths == 0 {
				t.Fatal("no process died between its writes")
			}
			if err := l.feed(ctx, r, l.stream); err != nil {
				t.Fatal(err)
			}
			l.check(t, ctx, r)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newSalesLog(t, ctx, 40)) })
	}
}

// errDied is what a dying store answers once it has died.
var errDied = errors.New("the process died")

// dying is a rollup store whose process dies after a number of year
// writes: its next write and everything after fail, the cursor's
// included, so a batch stops between its writes.
type dying struct {
	projection.RollupStore
	mu     sync.Mutex
	left   int // writes before it dies; -1: it does not
	isDead bool
}

func (d *dying) dieAfter(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.left = n
}

func (d *dying) died() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.isDead
}

func (d *dying) write() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.isDead {
		return errDied
	}
	if d.left == 0 {
		d.isDead = true
		return errDied
	}
	if d.left > 0 {
		d.left--
	}
	return nil
}

func (d *dying) SaveYear(ctx context.Context, coll string, m projection.SalesYear) (bool, error) {
	if err := d.write(); err != nil {
		return false, err
	}
	return d.RollupStore.SaveYear(ctx, coll, m)
}

func (d *dying) SaveCursor(ctx context.Context, coll string, c projection.RollupCursor) error {
	if err := d.write(); err != nil {
		return err
	}
	return d.RollupStore.SaveCursor(ctx, coll, c)
}

// published is where a relay has published up to, as a build reads it.
type published struct{ position, seq uint64 }

func (p published) Published(context.Context) (uint64, uint64, error) { return p.position, p.seq, nil }

// TestRollupBuildCountsEveryEventOnce builds the rollup in a shadow while
// the log grows: the relay has published half of the log when the build
// starts, the rest and the orders placed after the build's cut reach the
// shadow through the live feed, and the scan reads the whole log. Every
// event is counted once: by the scan when it was recorded up to the cut,
// by the live feed otherwise.
func TestRollupBuildCountsEveryEventOnce(t *testing.T) {
	ctx := projectiontest.Context(t, 2*time.Minute)
	l := newSalesLog(t, ctx, 30)
	def := projection.DailySales
	shadow := def.Key() + "_build"
	ps := mongodb.NewPointers(l.db)
	if _, err := ps.Update(ctx, def.Name, def.Collection, func(p *projection.Pointer) (bool, error) {
		p.Active, p.ActiveVersion, p.Shadow, p.ShadowVersion = "", 0, shadow, def.Ver()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	half := l.stream[len(l.stream)/2]
	r := projection.NewRollup(def, mongodb.NewRollups(l.db), l.es, nil, ps, published{half.Position, half.Seq}, 100*time.Millisecond)
	after, err := r.Prepare(ctx, shadow)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := r.Prepare(ctx, shadow); err != nil || !again.Equal(after) {
		t.Fatalf("Prepare run again: %v, %v; want %v", again, err, after)
	}
	// What the relay publishes after the build started, recorded before
	// its cut: left to the scan.
	for _, b := range l.batches(6) {
		if err := l.feed(ctx, r, b); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(after))
	// Orders placed after the cut: only the live feed counts them.
	before := len(l.stream)
	l.add(t, ctx, 12)
	var streams []domain.StreamEvents
	if err := l.es.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
		streams = append(streams, st)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for chunk := range slices.Chunk(streams, 7) {
		if _, err := r.WriteFolds(ctx, shadow, chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.feed(ctx, r, l.stream[before:]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.VerifySums(ctx, shadow, true, nil); err != nil {
		t.Fatal(err)
	}
	// A finish run again merges nothing twice.
	if _, err := r.VerifySums(ctx, shadow, true, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Update(ctx, def.Name, def.Collection, func(p *projection.Pointer) (bool, error) {
		p.Active, p.ActiveVersion, p.Shadow, p.ShadowVersion = shadow, def.Ver(), "", 0
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	l.check(t, ctx, r)
}

// TestRollupRecountsADeadLetterOnce: the events of a dead letter, counted
// by its retry, are counted once however often it is retried, in the
// collection readers read.
func TestRollupRecountsADeadLetterOnce(t *testing.T) {
	ctx := projectiontest.Context(t, time.Minute)
	l := newSalesLog(t, ctx, 6)
	r := rollupOn(t, ctx, l.db, l.es, mongodb.NewRollups(l.db))
	// Every event but one order's cancellation, which could not be
	// counted when it was delivered.
	var parked []domain.Event
	for i, d := range l.stream {
		if d.Event.Type == domain.TypeOrderCanceled && parked == nil {
			parked = []domain.Event{d.Event}
			l.stream[i].Err = errors.New("does not decode")
		}
	}
	if parked == nil {
		t.Fatal("the log holds no cancellation")
	}
	if err := l.feed(ctx, r, l.stream); err != nil && !strings.Contains(err.Error(), "poison") {
		t.Fatal(err)
	}
	for range 3 {
		if err := r.Recount(ctx, "daily_sales:"+parked[0].ID, parked); err != nil {
			t.Fatal(err)
		}
	}
	l.check(t, ctx, r)
}
