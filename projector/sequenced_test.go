package projector_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// salesFixture is a log of orders, published to the stream as the relay
// publishes them: each commit's events at consecutive log positions from
// 1, in the log's order.
type salesFixture struct {
	b     *projectortest.Bus
	db    *mongo.Database
	f     *projectiontest.Fixture
	ps    *mongodb.Pointers
	sales *projection.Rollup
	next  uint64 // the next log position
}

func newSalesFixture(t *testing.T, orders int) (context.Context, *salesFixture) {
	t.Helper()
	ctx, b, db, es := projectortest.Start(t, 2*time.Minute)
	s := &salesFixture{b: b, db: db, ps: mongodb.NewPointers(db), next: 1}
	// A store whose log was empty at its first start: the base
	// collection is the rollup's, from position 1.
	if err := s.ps.Ensure(ctx, projection.DailySales.Name, projection.DailySales.Collection, projection.DailySales.Ver()); err != nil {
		t.Fatal(err)
	}
	s.f = projectiontest.NewFixture(t, ctx, es, "sale", orders, 3)
	s.sales = projection.NewRollup(projection.DailySales, mongodb.NewRollups(db), es, nil, s.ps, nil, time.Second)
	return ctx, s
}

// publish publishes events as the relay does, one commit each.
func (s *salesFixture) publish(t *testing.T, ctx context.Context, events []domain.Event) {
	t.Helper()
	commits := make([]domain.RecordedCommit, len(events))
	positions := make([]uint64, len(events))
	for i, e := range events {
		body, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		commits[i] = domain.RecordedCommit{StreamID: e.StreamID, FirstVersion: e.Version, RecordedAt: e.RecordedAt, Events: []domain.EventMessage{{ID: e.ID, Body: body}}, Count: 1}
		positions[i] = s.next
		s.next++
	}
	if acked, _, err := bus.NewPublisher(s.b.JS, s.b.Stream).Send(ctx, commits, positions, time.Minute)(); err != nil || len(acked) != len(events) {
		t.Fatalf("publish %d events: %d acknowledged, %v", len(events), len(acked), err)
	}
}

// run starts the rollup's runner.
func (s *salesFixture) run(t *testing.T) *projector.Runner {
	t.Helper()
	r := projector.NewSequencedRunner(s.sales, s.b.JS, mongodb.NewDeadLetters(s.db), s.b.RunnerConfig(), projectiontest.Logger(t), nil)
	projectiontest.Go(t, "daily_sales runner", r.Run)
	return r
}

// checkSales asserts that the rollup's daily sales over the fixture's
// days equal the fixture's.
func (s *salesFixture) checkSales(t *testing.T, ctx context.Context) {
	t.Helper()
	want, first, last := s.f.ExpectedDailySales()
	from, _ := time.Parse(time.DateOnly, first)
	to, _ := time.Parse(time.DateOnly, last)
	got, err := s.sales.Sales(ctx, from, to, "")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("daily sales: %v\n got %s\nwant %s", err, projectiontest.Dump(got), projectiontest.Dump(want))
	}
}

// years reads every year of coll.
func (s *salesFixture) years(t *testing.T, ctx context.Context, coll string) []projection.SalesYear {
	t.Helper()
	ms, err := mongodb.NewRollups(s.db).Years(ctx, coll, "", "~")
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// A collection behind the stream's deliveries (here a shadow whose build
// started at the log's first position after the active collection had
// applied the whole log) reads the positions it lacks from the stream by
// sequence, and ends with the same sums.
func TestSequencedRunnerFillsGapsFromTheStream(t *testing.T) {
	ctx, s := newSalesFixture(t, 24)
	half := len(s.f.Flat) / 2
	s.publish(t, ctx, s.f.Flat[:half])
	r := s.run(t)
	projectortest.WaitLag(t, ctx, time.Minute, r)

	def := projection.DailySales
	shadow := def.Key() + "_behind"
	if err := mongodb.NewRollups(s.db).SaveCursor(ctx, shadow, projection.RollupCursor{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ps.Update(ctx, def.Name, def.Collection, func(p *projection.Pointer) (bool, error) {
		p.Shadow, p.ShadowVersion = shadow, def.Ver()
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The pointer is read at most WriterPointerAge old: the next batch
	// names the shadow.
	time.Sleep(2 * projection.WriterPointerAge)
	s.publish(t, ctx, s.f.Flat[half:])
	projectortest.WaitLag(t, ctx, time.Minute, r)
	projectiontest.WaitFor(t, 30*time.Second, "the shadow's sums equal the active collection's", func() error {
		active, behind := s.years(t, ctx, def.Collection), s.years(t, ctx, shadow)
		for _, ms := range [][]projection.SalesYear{active, behind} {
			for i := range ms {
				ms[i].Position, ms[i].Rev = 0, 0
			}
		}
		if !reflect.DeepEqual(active, behind) {
			return fmt.Errorf("active %s\nshadow %s", projectiontest.Dump(active), projectiontest.Dump(behind))
		}
		return nil
	})
	if err := projectiontest.DiffReadModels(ctx, s.db, s.f); err != nil && !strings.Contains(err.Error(), "summary") {
		t.Fatal(err)
	}
	s.checkSales(t, ctx)
}

// Positions the stream no longer holds leave a hole nothing fills: the
// rollup sets the collection aside, the pointer says why, and readers are
// answered from the summaries until a build replaces it.
func TestSequencedRunnerSetsAsideACollectionThatLostPositions(t *testing.T) {
	ctx, s := newSalesFixture(t, 8)
	s.publish(t, ctx, s.f.Flat)
	st, err := s.b.JS.Stream(ctx, s.b.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if err := st.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	r := s.run(t)
	def := projection.DailySales
	projectiontest.WaitFor(t, 30*time.Second, "the pointer says the rollup lost positions", func() error {
		p, err := s.ps.Get(ctx, def.Name, def.Collection, 0)
		if err != nil {
			return err
		}
		if !strings.Contains(p.Broken, projection.ErrPositionsLost.Error()) {
			return fmt.Errorf("pointer %+v", p)
		}
		return nil
	})
	projectortest.WaitLag(t, ctx, time.Minute, r)
	if ms := s.years(t, ctx, def.Collection); len(ms) != 0 {
		t.Errorf("the rollup counted past its hole: %s", projectiontest.Dump(ms))
	}
	reader := mongodb.NewReader(s.db, s.ps, s.sales)
	if _, answered, err := reader.DailySales(ctx, time.Now(), time.Now(), ""); answered != projection.OrderSummaries.Name {
		t.Errorf("daily sales answered by %q (%v), want the summaries while the rollup is set aside", answered, err)
	}
	if _, err := s.sales.Sales(ctx, time.Now(), time.Now(), ""); !errors.Is(err, domain.ErrNotBuilt) {
		t.Errorf("the rollup's own read: %v, want ErrNotBuilt", err)
	}
}

// Positions published after later ones (a relay round lost in a NATS
// election while the next got through, then published again at its
// positions) are waited for and counted once they are in the stream: the
// collection is not set aside, and the sums equal the log's.
func TestSequencedRunnerWaitsForPositionsPublishedAfterLaterOnes(t *testing.T) {
	ctx, s := newSalesFixture(t, 8)
	early := s.f.Flat[:3]
	s.next += uint64(len(early)) // their positions, 1 to 3, are published last
	s.publish(t, ctx, s.f.Flat[3:])
	r := s.run(t)
	projectiontest.WaitFor(t, 30*time.Second, "the runner waiting for positions 1 to 3", func() error {
		if !strings.Contains(r.LastError(), "not in the stream yet") {
			return fmt.Errorf("last error %q", r.LastError())
		}
		return nil
	})
	s.next = 1
	s.publish(t, ctx, early)
	projectortest.WaitLag(t, ctx, time.Minute, r)
	def := projection.DailySales
	p, err := s.ps.Get(ctx, def.Name, def.Collection, 0)
	if err != nil || p.Broken != "" {
		t.Fatalf("pointer %+v, %v; want the rollup not set aside", p, err)
	}
	s.checkSales(t, ctx)
}

// The positions after a republished round's were published before it, at
// lower sequences: a run whose event before a gap is of that round finds
// the gap's positions below it. Here a process that held the consumer
// before took positions 4 to 23 and died with them (they come back only
// after AckWait); this one gets 24, then 1 to 3, published again last,
// and reads 4 to 23 from the stream below 3's sequence.
func TestSequencedRunnerFillsGapsBelowTheSequenceBeforeThem(t *testing.T) {
	ctx, s := newSalesFixture(t, 8)
	n := len(s.f.Flat)
	s.next = 4
	s.publish(t, ctx, s.f.Flat[3:n-1]) // positions 4 to n-1 at sequences 1 to n-4
	s.publish(t, ctx, s.f.Flat[n-1:])  // n at n-3
	s.next = 1
	s.publish(t, ctx, s.f.Flat[:3]) // 1 to 3 at n-2 to n

	cfg := s.b.RunnerConfig()
	cfg.AckWait = 10 * time.Minute
	r := projector.NewSequencedRunner(s.sales, s.b.JS, mongodb.NewDeadLetters(s.db), cfg, projectiontest.Logger(t), nil)
	cons, err := r.Consumer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	held, err := cons.Fetch(n-4, jetstream.FetchPriorityGroup(projector.PinGroup), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range held.Messages() {
		if pos := bus.Position(m.Headers()); pos < 4 || pos >= uint64(n) {
			t.Fatalf("the first holder got position %d", pos)
		}
		got++
	}
	if got != n-4 || held.Error() != nil {
		t.Fatalf("the first holder got %d messages (%v), want %d", got, held.Error(), n-4)
	}

	projectiontest.Go(t, "daily_sales runner", r.Run)
	projectiontest.WaitFor(t, time.Minute, "the daily sales equal the log's", func() error {
		want, first, last := s.f.ExpectedDailySales()
		from, _ := time.Parse(time.DateOnly, first)
		to, _ := time.Parse(time.DateOnly, last)
		got, err := s.sales.Sales(ctx, from, to, "")
		if err != nil || !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%v (last error %q)\n got %s\nwant %s", err, r.LastError(), projectiontest.Dump(got), projectiontest.Dump(want))
		}
		return nil
	})
	def := projection.DailySales
	if p, err := s.ps.Get(ctx, def.Name, def.Collection, 0); err != nil || p.Broken != "" {
		t.Fatalf("pointer %+v, %v; want the rollup not set aside", p, err)
	}
}
