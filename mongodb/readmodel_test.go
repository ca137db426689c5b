package mongodb_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// applier is ReadModel.Apply of either projection.
type applier func(ctx context.Context, events []domain.Event) (projection.Outcome, map[string]error, error)

// shuffledWithDuplicates is every event of evs once plus about half of
// them again, shuffled.
func shuffledWithDuplicates(rng *rand.Rand, evs []domain.Event) []domain.Event {
	out := slices.Clone(evs)
	for _, e := range evs {
		if rng.IntN(2) == 0 {
			out = append(out, e)
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// chunks splits evs into consecutive batches of 1 to max events.
func chunks(rng *rand.Rand, evs []domain.Event, max int) [][]domain.Event {
	var out [][]domain.Event
	for len(evs) > 0 {
		n := min(1+rng.IntN(max), len(evs))
		out = append(out, evs[:n])
		evs = evs[n:]
	}
	return out
}

func singles(evs []domain.Event) [][]domain.Event {
	var out [][]domain.Event
	for _, e := range evs {
		out = append(out, []domain.Event{e})
	}
	return out
}

// TestStoreApplyIdempotentAndOrderTolerant is invariant 4 on one writer:
// whatever the delivery (in order, twice, reversed, shuffled with
// duplicates, only the last event of each stream), both read models end
// equal to the fold of the log, every event is folded exactly once, and
// the skipped duplicates and filled gaps are counted.
func TestStoreApplyIdempotentAndOrderTolerant(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	es, _ := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "ord", 7, 3)
	total, gappy := len(f.Flat), multiEventStreams(f)
	if total < 25 || gappy < 6 {
		t.Fatalf("fixture too small: %d events, %d multi-event streams", total, gappy)
	}

	type want struct{ applied, duplicates, gaps int } // -1: not checked
	cases := []struct {
		name    string
		batches func(rng *rand.Rand) [][]domain.Event
		want    want
	}{
		{"once in order", func(*rand.Rand) [][]domain.Event { return [][]domain.Event{f.Flat} },
			want{total, 0, 0}},
		{"once in order one by one", func(*rand.Rand) [][]domain.Event { return singles(f.Flat) },
			want{total, 0, 0}},
		{"twice", func(*rand.Rand) [][]domain.Event { return [][]domain.Event{f.Flat, f.Flat} },
			want{total, total, 0}},
		{"twice one by one", func(*rand.Rand) [][]domain.Event { return append(singles(f.Flat), singles(f.Flat)...) },
			want{total, total, 0}},
		{"twice in one batch", func(*rand.Rand) [][]domain.Event { return [][]domain.Event{append(slices.Clone(f.Flat), f.Flat...)} },
			want{total, -1, 0}},
		{"reversed in one batch", func(*rand.Rand) [][]domain.Event { return [][]domain.Event{reversed(f.Flat)} },
			want{total, 0, 0}},
		{"reversed one by one", func(*rand.Rand) [][]domain.Event { return singles(reversed(f.Flat)) },
			// Each stream's last event comes first: a gap, filled from the
			// log; the stream's other events are then duplicates.
			want{total, total - len(f.IDs), gappy}},
		{"only the last events", func(*rand.Rand) [][]domain.Event { return [][]domain.Event{lastEvents(f)} },
			want{total, 0, gappy}},
		{"only the last events, then all again", func(*rand.Rand) [][]domain.Event {
			return [][]domain.Event{lastEvents(f), f.Flat}
		}, want{total, total, gappy}},
	}
	for seed := uint64(1); seed <= 3; seed++ {
		cases = append(cases, struct {
			name    string
			batches func(rng *rand.Rand) [][]domain.Event
			want    want
		}{fmt.Sprintf("shuffled with duplicates seed %d", seed), func(rng *rand.Rand) [][]domain.Event {
			return chunks(rng, shuffledWithDuplicates(rng, f.Flat), 12)
		}, want{total, -1, -1}})
	}

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db := storetest.Database(t)
			stores := map[string]applier{
				projection.OrderSummaries.Name:     mongodb.NewReadModel(db, projection.OrderSummaries, es, nil).Apply,
				projectiontest.CustomerTotals.Name: mongodb.NewReadModel(db, projectiontest.CustomerTotals, es, nil).Apply,
			}
			batches := tc.batches(rand.New(rand.NewPCG(uint64(i), 0x5eed)))
			for name, apply := range stores {
				var sum projection.Outcome
				for _, b := range batches {
					out, poison, err := apply(ctx, b)
					if err != nil || len(poison) > 0 {
						t.Fatalf("%s: Apply(%d events): poison %v, err %v", name, len(b), poison, err)
					}
					sum.Applied += out.Applied
					sum.Duplicates += out.Duplicates
					sum.GapsFilled += out.GapsFilled
				}
				w := tc.want
				if sum.Applied != w.applied || (w.duplicates >= 0 && sum.Duplicates != w.duplicates) || (w.gaps >= 0 && sum.GapsFilled != w.gaps) {
					t.Errorf("%s: outcome %+v over %d batches, want applied %d, duplicates %d, gaps filled %d (-1: any)",
						name, sum, len(batches), w.applied, w.duplicates, w.gaps)
				}
			}
			if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStoreReadsNotFound: an order or customer with no document is
// domain.ErrNotFound, not an empty value.
func TestStoreReadsNotFound(t *testing.T) {
	ctx := projectiontest.Context(t, 30*time.Second)
	db := storetest.Database(t)
	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	if _, err := r.Summary(ctx, "nope"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("Summary of an unknown order: %v, want ErrNotFound", err)
	}
	if _, err := r.CustomerStats(ctx, "nobody"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("CustomerStats of an unknown customer: %v, want ErrNotFound", err)
	}
}

// TestStoreApplyRacingWriters is the racing half of invariant 4: eight
// writers apply events of the same 20 orders at once, through one Store
// (the workers of one process) and, where single-document updates are
// atomic, also half through a second Store on a second client (two
// processes); no update may be lost: both read models end equal to the
// fold of the log. A writer whose Apply reports an error retries the batch,
// as the Runner's redelivery would.
//
//   - shuffled subsets: each writer has a random half of the events plus
//     every stream's last event, with duplicates, shuffled, in batches;
//   - prefixes: all writers apply at once one batch holding, for every
//     stream, a prefix of a different length, only one writer having the
//     heads; a lower write that lands after the head write must not stay
//     (the sharpest check of the compare-and-set), three rounds.
//
// The test checks that Apply calls on the same documents did overlap, so
// it proves something.
func TestStoreApplyRacingWriters(t *testing.T) {
	ctx := projectiontest.Context(t, 90*time.Second)
	es, _ := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "race", 20, 4)
	const writers = 8

	t.Run("shuffled subsets", func(t *testing.T) {
		last := lastEvents(f)
		plans := make([][][]domain.Event, writers)
		for w := range plans {
			rng := rand.New(rand.NewPCG(uint64(w), 0xcafe))
			var mine []domain.Event
			for _, e := range f.Flat {
				if rng.IntN(2) == 0 {
					mine = append(mine, e)
				}
			}
			plans[w] = chunks(rng, shuffledWithDuplicates(rng, append(mine, last...)), 24)
		}
		forProcesses(t, func(t *testing.T, processes int) { race(t, ctx, es, f, plans, processes) })
	})
	t.Run("prefixes", func(t *testing.T) {
		for round := range 3 {
			plans := make([][][]domain.Event, writers)
			for w := range plans {
				var batch []domain.Event
				for _, id := range f.IDs {
					evs := f.Events[id]
					batch = append(batch, evs[:1+(len(evs)-1)*((w+round)%writers)/(writers-1)]...)
				}
				rng := rand.New(rand.NewPCG(uint64(w), uint64(round)))
				rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				plans[w] = [][]domain.Event{batch}
			}
			forProcesses(t, func(t *testing.T, processes int) { race(t, ctx, es, f, plans, processes) })
			if t.Failed() {
				t.Fatalf("round %d lost an update", round)
			}
		}
	})
}

// forProcesses runs fn as one process and as two (Stores on their own
// clients, as separate processes would be).
func forProcesses(t *testing.T, fn func(t *testing.T, processes int)) {
	t.Run("one process", func(t *testing.T) { fn(t, 1) })
	t.Run("two processes", func(t *testing.T) { fn(t, 2) })
}

// race runs one writer per plan at once on a fresh read model, spread over
// processes Stores on their own clients, each applying its batches to both
// projections (alternating which goes first), and then compares the read
// models with the fold of the log.
func race(t *testing.T, ctx context.Context, es *mongodb.EventStore, f *projectiontest.Fixture, plans [][][]domain.Event, processes int) {
	t.Helper()
	db := storetest.Database(t)
	other := storetest.Client(t).Database(db.Name())
	reg := prometheus.NewRegistry()
	m := projection.NewMetrics(reg)
	type pair struct{ sums, stats applier }
	stores := []pair{
		{mongodb.NewReadModel(db, projection.OrderSummaries, es, m).Apply, mongodb.NewReadModel(db, projectiontest.CustomerTotals, es, m).Apply},
		{mongodb.NewReadModel(other, projection.OrderSummaries, es, m).Apply, mongodb.NewReadModel(other, projectiontest.CustomerTotals, es, m).Apply},
	}
	o := &overlaps{inFlight: map[string]int{}}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w, batches := range plans {
		p := stores[w%processes]
		wg.Go(func() {
			<-start
			for i, b := range batches {
				order := []string{"sums", "stats"}
				if (i+w)%2 == 1 {
					order = []string{"stats", "sums"}
				}
				for _, name := range order {
					apply := p.sums
					if name == "stats" {
						apply = p.stats
					}
					if err := o.apply(ctx, name, apply, b); err != nil {
						t.Errorf("writer %d: %v", w, err)
						return
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Error(err)
	}
	t.Logf("Apply calls that started while another one on the same stream was running: %d; retried after an error: %d",
		o.overlapping, o.retries)
	for _, mf := range projectiontest.MustGather(t, reg) {
		if strings.Contains(mf.GetName(), "retries") || strings.Contains(mf.GetName(), "repairs") {
			for _, mt := range mf.GetMetric() {
				t.Logf("%s%v = %v", mf.GetName(), mt.GetLabel(), mt.GetCounter().GetValue())
			}
		}
	}
	if o.overlapping == 0 {
		t.Errorf("no two Apply calls on one stream overlapped: the writers did not race, the test proved nothing")
	}
}

// overlaps applies batches for the racing writers, counting the calls that
// start while another call of the same projection holding an event of the
// same stream is running, and retrying (up to 20 times) a call that
// reports a failure that may pass, as a redelivery would.
type overlaps struct {
	mu          sync.Mutex
	inFlight    map[string]int // projection/stream -> calls running
	overlapping int
	retries     int
}

func (o *overlaps) apply(ctx context.Context, projection string, apply applier, b []domain.Event) error {
	streams := map[string]bool{}
	for _, e := range b {
		streams[projection+"/"+e.StreamID] = true
	}
	o.mu.Lock()
	raced := false
	for s := range streams {
		raced = raced || o.inFlight[s] > 0
		o.inFlight[s]++
	}
	if raced {
		o.overlapping++
	}
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		for s := range streams {
			o.inFlight[s]--
		}
		o.mu.Unlock()
	}()
	var err error
	for range 20 {
		var poison map[string]error
		_, poison, err = apply(ctx, b)
		if len(poison) > 0 {
			return fmt.Errorf("poison in a batch of the log's events: %v", poison)
		}
		if err == nil {
			return nil
		}
		o.mu.Lock()
		o.retries++
		o.mu.Unlock()
	}
	return fmt.Errorf("Apply of %d events still failing after 20 tries: %w", len(b), err)
}

// TestStoreApplyPoisonIsPerStream: events that cannot be applied come back
// in the per-stream error map, their stream's document stays as it was, and
// the other streams of the same batch are written.
func TestStoreApplyPoisonIsPerStream(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	es, _ := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "ok", 5, 2)
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

	// "corrupt": a log whose v2 is an illegal transition (created ->
	// delivered). The store checks versions, not transitions, so the log
	// takes it; the fold must not.
	projectiontest.AppendStream(t, ctx, es, "corrupt", []domain.EventData{projectiontest.Lifecycle(0, "cust-corrupt")[0], domain.OrderDelivered{}}, 1, at)
	corrupt, err := es.Load(ctx, "corrupt", 0)
	if err != nil || len(corrupt) != 2 {
		t.Fatalf("load corrupt: %d events, %v", len(corrupt), err)
	}
	// "ghost": an event at v2 of a stream the log does not hold, so its gap
	// cannot be filled.
	ghost := projectiontest.NewEvent("ghost", 2, domain.OrderApproved{}, at)

	db := storetest.Database(t)
	sums := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil)
	stats := mongodb.NewReadModel(db, projectiontest.CustomerTotals, es, nil)
	for _, p := range []struct {
		name    string
		apply   applier
		version func(id string) (int64, error)
	}{
		{projection.OrderSummaries.Name, sums.Apply, func(id string) (int64, error) {
			o, err := mongodb.Doc[domain.Order](ctx, db, projection.OrderSummaries.Collection, id)
			return o.Version, err
		}},
		{projectiontest.CustomerTotals.Name, stats.Apply, func(id string) (int64, error) {
			c, err := mongodb.Doc[projectiontest.Contribution](ctx, db, projectiontest.CustomerTotals.Collection, id)
			return c.Version, err
		}},
	} {
		// corrupt v1 alone is fine.
		if _, poison, err := p.apply(ctx, corrupt[:1]); err != nil || len(poison) > 0 {
			t.Fatalf("%s: Apply(corrupt v1): poison %v, err %v", p.name, poison, err)
		}
		batch := append([]domain.Event{ghost, corrupt[1]}, reversed(f.Flat)...)
		out, poison, err := p.apply(ctx, batch)
		if err != nil {
			t.Fatalf("%s: Apply: %v", p.name, err)
		}
		if len(poison) != 2 || poison["ghost"] == nil || poison["corrupt"] == nil {
			t.Fatalf("%s: poison = %v, want errors for exactly ghost and corrupt", p.name, poison)
		}
		if !errors.Is(poison["corrupt"], domain.ErrInvalidTransition) {
			t.Errorf("%s: poison[corrupt] = %v, want ErrInvalidTransition", p.name, poison["corrupt"])
		}
		if out.Applied != len(f.Flat) || out.GapsFilled != 1 {
			t.Errorf("%s: outcome %+v, want %d applied (the healthy streams) and 1 gap filled (ghost's attempt)", p.name, out, len(f.Flat))
		}
		if _, err := p.version("ghost"); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("%s: ghost document: %v, want ErrNotFound", p.name, err)
		}
		if v, err := p.version("corrupt"); err != nil || v != 1 {
			t.Errorf("%s: corrupt document at v%d (%v), want v1: the poison event must not move it", p.name, v, err)
		}
		// A poison stream stays poison on redelivery.
		if _, poison, err := p.apply(ctx, []domain.Event{corrupt[1]}); err != nil || poison["corrupt"] == nil {
			t.Errorf("%s: Apply(corrupt v2) again: poison %v, err %v; want poison", p.name, poison, err)
		}
	}
	// The healthy streams of the batches are written in full.
	if err := projectiontest.DiffReadModels(ctx, db, f, true); err != nil {
		t.Fatal(err)
	}
}

// An event that cannot be applied does not hold back the good events
// before it: they are written, and the error says how far the document got,
// so the runner acknowledges them and parks only the rest.
func TestStoreApplyWritesPrefixBeforePoison(t *testing.T) {
	ctx := projectiontest.Context(t, 30*time.Second)
	db := storetest.Database(t)
	at := domain.Timestamp(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	ev := func(v int64, d domain.EventData) domain.Event {
		return domain.Event{ID: fmt.Sprintf("e%d", v), StreamID: "p-1", StreamType: domain.StreamTypeOrder, Type: d.EventType(),
			Version: v, OccurredAt: at, RecordedAt: at, Data: d, Metadata: domain.Metadata{SchemaVersion: 1}}
	}
	events := []domain.Event{
		ev(1, domain.OrderPlaced{CustomerID: "c-1", Currency: "BRL", Items: []domain.Line{{SKU: "s", Quantity: 1, UnitPriceCents: 100}}}),
		ev(2, domain.OrderApproved{}),
		ev(3, domain.OrderDelivered{}), // not from approved: cannot apply
	}
	store := mongodb.NewReadModel(db, projection.OrderSummaries, nil, nil)
	out, poison, err := store.Apply(ctx, events)
	if err != nil {
		t.Fatal(err)
	}
	var pe *projection.PoisonError
	if !errors.As(poison["p-1"], &pe) || pe.Reached != 2 || !errors.Is(pe, domain.ErrInvalidTransition) {
		t.Fatalf("poison = %v, want a PoisonError at v2 wrapping ErrInvalidTransition", poison["p-1"])
	}
	if out.Applied != 2 {
		t.Errorf("applied %d events, want 2", out.Applied)
	}
	o, err := mongodb.Doc[domain.Order](ctx, db, projection.OrderSummaries.Collection, "p-1")
	if err != nil || o.Version != 2 || o.Status != domain.StatusApproved {
		t.Fatalf("summary = v%d %s, %v; want v2 approved", o.Version, o.Status, err)
	}
}

// TestReaderListSummaries: filters by customer and status, and cursor
// pagination with limit 3 that returns every matching summary exactly once,
// in order id order.
func TestReaderListSummaries(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	es, db := storetest.OpenStore(t)
	f := projectiontest.NewFixture(t, ctx, es, "lst", 14, 3)
	s := mongodb.NewReadModel(db, projection.OrderSummaries, es, nil)
	if err := s.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	// Insert out of id order, so id order is the query's doing.
	if _, poison, err := s.Apply(ctx, reversed(f.Flat)); err != nil || len(poison) > 0 {
		t.Fatalf("Apply: poison %v, err %v", poison, err)
	}
	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)

	const limit = 3
	cases := []struct{ customer, status string }{
		{"", ""},
		{"cust-1", ""},
		{"", string(domain.StatusDelivered)},
		{"", string(domain.StatusCreated)},
		{"cust-0", string(domain.StatusCanceled)},
		{"cust-2", string(domain.StatusShipped)}, // matches nothing
		{"nobody", ""},
	}
	for _, tc := range cases {
		t.Run(tc.customer+"/"+tc.status, func(t *testing.T) {
			var want []domain.Order
			for _, id := range f.IDs { // ids are in id order
				o := f.Orders[id]
				if (tc.customer == "" || o.CustomerID == tc.customer) && (tc.status == "" || string(o.Status) == tc.status) {
					want = append(want, o)
				}
			}
			if tc.customer == "" && tc.status == "" && len(want) != len(f.IDs) {
				t.Fatalf("want %d, fixture has %d", len(want), len(f.IDs))
			}
			var got []domain.Order
			after := ""
			for page := 0; ; page++ {
				if page > len(f.IDs) {
					t.Fatalf("more than %d pages: the cursor does not advance", page)
				}
				p, err := r.ListSummaries(ctx, tc.customer, tc.status, after, limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(p) > limit {
					t.Fatalf("page %d after %q: %d summaries, limit %d", page, after, len(p), limit)
				}
				got = append(got, p...)
				if len(p) < limit {
					break
				}
				after = p[len(p)-1].ID
			}
			if !slices.IsSortedFunc(got, func(a, b domain.Order) int { return strings.Compare(a.ID, b.ID) }) {
				t.Errorf("not in id order: %v", ids(got))
			}
			if len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
				t.Errorf("listed %v, want %v", ids(got), ids(want))
			}
		})
	}

	// A cursor past the last id is an empty page, not an error.
	if p, err := r.ListSummaries(ctx, "", "", f.IDs[len(f.IDs)-1], limit); err != nil || len(p) != 0 {
		t.Errorf("page after the last id: %v (%v), want empty", ids(p), err)
	}
}

func ids(os []domain.Order) []string {
	out := make([]string, len(os))
	for i, o := range os {
		out[i] = o.ID
	}
	return out
}

// TestReadModelsCountLineFreight: both read models fold an order whose
// lines carry their own freight into totals that include it, and an order
// placed before lines had freight (schema 1, freight on the order) into
// the totals it always had.
func TestReadModelsCountLineFreight(t *testing.T) {
	ctx := projectiontest.Context(t, 60*time.Second)
	es, db := storetest.OpenStore(t)
	at := time.Date(2018, 1, 2, 3, 4, 5, 0, time.UTC)
	lines := domain.OrderPlaced{CustomerID: "cust-f", Currency: "BRL", Items: []domain.Line{
		{SKU: "sku-a", Quantity: 2, UnitPriceCents: 5890, FreightCents: 1579},
		{SKU: "sku-b", Quantity: 1, UnitPriceCents: 2999, FreightCents: 872},
	}}
	old := domain.OrderPlaced{CustomerID: "cust-f", Currency: "BRL", FreightCents: 1500,
		Items: []domain.Line{{SKU: "sku-c", Quantity: 1, UnitPriceCents: 4990}}}
	oldEvent := projectiontest.NewEvent("f-old", 1, old, at)
	oldEvent.Metadata.SchemaVersion = 1 // as written before lines had freight
	var events []domain.Event
	for _, e := range []domain.Event{projectiontest.NewEvent("f-lines", 1, lines, at), oldEvent} {
		if _, err := es.Append(ctx, domain.Commit{StreamID: e.StreamID, StreamType: e.StreamType, Events: []domain.Event{e}}); err != nil {
			t.Fatal(err)
		}
		evs, err := es.LoadFrom(ctx, e.StreamID, 1)
		if err != nil || len(evs) != 1 {
			t.Fatalf("load %s: %v, %v", e.StreamID, evs, err)
		}
		events = append(events, evs...)
	}
	if v := events[1].Metadata.SchemaVersion; v != 1 {
		t.Fatalf("the old-shape order was stored at schema %d, want 1", v)
	}
	for _, s := range []interface {
		Apply(context.Context, []domain.Event) (projection.Outcome, map[string]error, error)
	}{
		mongodb.NewReadModel(db, projection.OrderSummaries, es, nil),
		mongodb.NewReadModel(db, projectiontest.CustomerTotals, es, nil),
	} {
		if _, poison, err := s.Apply(ctx, events); err != nil || len(poison) > 0 {
			t.Fatalf("Apply: poison %v, err %v", poison, err)
		}
	}

	r := mongodb.NewReader(db, mongodb.NewPointers(db), nil)
	want := map[string]struct{ freight, total int64 }{
		"f-lines": {1579 + 872, 2*5890 + 2999 + 1579 + 872},
		"f-old":   {1500, 4990 + 1500},
	}
	for id, w := range want {
		o, err := r.Summary(ctx, id)
		if err != nil {
			t.Fatalf("summary %s: %v", id, err)
		}
		if o.FreightCents != w.freight || o.TotalCents != w.total {
			t.Errorf("summary %s: freight %d, total %d; want %d, %d", id, o.FreightCents, o.TotalCents, w.freight, w.total)
		}
	}
	if o, _ := r.Summary(ctx, "f-lines"); !reflect.DeepEqual(o.Items, lines.Items) {
		t.Errorf("summary items %+v, want %+v", o.Items, lines.Items)
	}
	stats, err := r.CustomerStats(ctx, "cust-f")
	if err != nil {
		t.Fatal(err)
	}
	if v := stats.LifetimeValueCents["BRL"]; v != want["f-lines"].total+want["f-old"].total {
		t.Errorf("lifetime value %d, want %d", v, want["f-lines"].total+want["f-old"].total)
	}
}
