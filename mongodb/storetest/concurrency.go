package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
)

// attempt is one append of the concurrency tests.
type attempt struct {
	c   domain.Commit
	err error
}

func testConcurrentAppenders(t *testing.T, s store) {
	// The writers stop when the stream reaches targetEvents, after
	// maxAttempts appends in all, or after budget. On the embedded FerretDB
	// under the race detector 64 concurrent loads of a growing stream take
	// seconds each, so there the budget is what ends the run (some 40
	// commits, each won against up to 63 rivals). An append is never cut
	// short: its outcome must be known for the checks below.
	const (
		writers      = 64
		targetEvents = 200
		maxAttempts  = 2000
		budget       = 15 * time.Second
	)
	ctx := t.Context()
	deadline := time.Now().Add(budget)
	loadCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stream := Unique("order-")
	var (
		tries atomic.Int64
		head  atomic.Int64 // highest version a successful append reached
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	results := make([][]attempt, writers)
	failures := make([]error, writers) // an error other than a conflict ends a writer
	for g := range writers {
		wg.Go(func() {
			<-start
			// known is the head this writer last loaded or wrote. After a
			// conflict it loads the events after it, like a cached state
			// catching up, and appends at the new head.
			known, stale := int64(0), true
			conflicts := 0 // in a row, for the backoff
			for head.Load() < targetEvents && loadCtx.Err() == nil && tries.Add(1) <= maxAttempts {
				if stale {
					// A jittered backoff after a conflict, as the command
					// service does, so the losers do not all reload at once.
					time.Sleep(time.Duration(rand.Int64N(int64(min(time.Millisecond<<conflicts, 100*time.Millisecond)) + 1)))
					evs, err := s.Load(loadCtx, stream, known)
					if loadCtx.Err() != nil || (err != nil && (!time.Now().Before(deadline) || errors.Is(err, context.DeadlineExceeded))) {
						// Out of time: a load may be cut short (the driver
						// refuses one whose remaining time is below its
						// round-trip estimate), an append never is.
						return
					}
					if err != nil {
						failures[g] = fmt.Errorf("load after v%d: %w", known, err)
						return
					}
					for i, e := range evs {
						if e.Version != known+int64(i)+1 {
							failures[g] = fmt.Errorf("load after v%d: event %d is v%d", known, i, e.Version)
							return
						}
					}
					known, stale = known+int64(len(evs)), false
				}
				data := []domain.EventData{domain.OrderCanceled{Reason: fmt.Sprintf("writer %d try %d", g, len(results[g]))}}
				for range (g + len(results[g])) % 3 {
					data = append(data, domain.OrderApproved{})
				}
				c := NewCommit(stream, known, data...)
				_, err := s.Append(ctx, c)
				results[g] = append(results[g], attempt{c, err})
				if err != nil {
					stale, conflicts = true, min(conflicts+1, 7)
					continue
				}
				known, conflicts = c.LastVersion(), 0
				for h := head.Load(); h < known && !head.CompareAndSwap(h, known); h = head.Load() {
				}
			}
		})
	}
	close(start)
	wg.Wait()

	for g, err := range failures {
		if err != nil {
			t.Errorf("writer %d: %v", g, err)
		}
	}
	var wins []domain.Commit
	conflicts := 0
	failed := map[string]bool{} // causation ids of refused commits
	for _, rs := range results {
		for _, a := range rs {
			switch {
			case a.err == nil:
				wins = append(wins, a.c)
			case errors.Is(a.err, domain.ErrVersionConflict):
				conflicts++
				failed[a.c.Events[0].Metadata.CausationID] = true
			default:
				t.Errorf("append %s at v%d: %v, want success or ErrVersionConflict", a.c.StreamID, a.c.ExpectedVersion, a.err)
			}
		}
	}
	t.Logf("%d appends: %d committed, %d conflicts; head v%d", len(wins)+conflicts, len(wins), conflicts, head.Load())
	if len(wins) < 2 {
		t.Fatalf("%d appends succeeded; the test needs progress", len(wins))
	}

	evs := mustLoad(t, s, stream)
	seen := make(map[int64]int, len(evs))
	byID := make(map[string]domain.Event, len(evs))
	commits := map[string]bool{}
	for _, e := range evs {
		seen[e.Version]++
		byID[e.ID] = e
		commits[e.Metadata.CausationID] = true
		if failed[e.Metadata.CausationID] {
			t.Errorf("v%d (%s) belongs to a refused append", e.Version, e.ID)
		}
	}
	n := head.Load()
	if int64(len(evs)) != n {
		t.Errorf("stream holds %d events, the highest committed version is %d", len(evs), n)
	}
	for v := int64(1); v <= n; v++ {
		if seen[v] != 1 {
			t.Errorf("version %d appears %d times", v, seen[v])
		}
	}
	total := 0
	for _, c := range wins {
		total += len(c.Events)
		for _, e := range c.Events {
			got, ok := byID[e.ID]
			if !ok {
				t.Errorf("event %s of a successful append (v%d) is missing", e.ID, e.Version)
				continue
			}
			if got.Version != e.Version || got.Type != e.Type || !reflect.DeepEqual(got.Data, e.Data) {
				t.Errorf("event %s: stored as %s v%d %+v, appended as %s v%d %+v", e.ID, got.Type, got.Version, got.Data, e.Type, e.Version, e.Data)
			}
		}
	}
	if total != len(evs) {
		t.Errorf("successful appends wrote %d events, the stream holds %d", total, len(evs))
	}
	if len(commits) != len(wins) {
		t.Errorf("the log holds %d commits, %d appends succeeded", len(commits), len(wins))
	}
	wantCommits(t, s, inStream(stream), int64(len(wins)))
}

func testRaceSameVersion(t *testing.T, s store) {
	stream := Unique("order-")
	var want []domain.Event
	want = raceAt(t, s, stream, want) // a new stream: everyone expects v0
	c := NewCommit(stream, int64(len(want)), domain.OrderInvoiced{}, domain.OrderApproved{})
	want = append(want, appendRecorded(t, s, c)...)
	raceAt(t, s, stream, want) // a stream with a head
	wantCommits(t, s, inStream(stream), 3)
}

// raceAt lets 64 goroutines append to stream at the head of want at once:
// exactly one may win. It returns want with the winner's events.
func raceAt(t *testing.T, s store, stream string, want []domain.Event) []domain.Event {
	t.Helper()
	const racers = 64
	expected := int64(len(want))
	commits := make([]domain.Commit, racers)
	for i := range commits {
		data := []domain.EventData{domain.OrderCanceled{Reason: fmt.Sprintf("racer %d", i)}}
		if i%2 == 1 {
			data = append(data, domain.OrderShipped{})
		}
		commits[i] = NewCommit(stream, expected, data...)
	}
	ats, errs := appendAtOnce(t, s, commits)
	winner, conflicts := oneWinner(t, fmt.Sprintf("at v%d", expected), errs, domain.ErrVersionConflict)
	if conflicts != racers-1 {
		t.Errorf("at v%d: %d conflicts, want %d", expected, conflicts, racers-1)
	}
	want = append(want, recorded(commits[winner], ats[winner])...)
	wantEvents(t, s, stream, want)
	return want
}

// appendAtOnce appends each commit from a goroutine of its own, all let go
// together so that they race, and returns each append's result by index.
func appendAtOnce(t *testing.T, s store, commits []domain.Commit) ([]time.Time, []error) {
	ats := make([]time.Time, len(commits))
	errs := make([]error, len(commits))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range commits {
		wg.Go(func() {
			<-start
			ats[i], errs[i] = s.Append(t.Context(), commits[i])
		})
	}
	close(start)
	wg.Wait()
	return ats, errs
}

// oneWinner returns the index of the one append of a race that succeeded
// and how many failed with loser. It reports a second winner and any other
// error, and ends the test when nobody won; race names the race.
func oneWinner(t *testing.T, race string, errs []error, loser error) (winner, losers int) {
	t.Helper()
	winner = -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("%s: racers %d and %d both won", race, winner, i)
		case err == nil:
			winner = i
		case errors.Is(err, loser):
			losers++
		default:
			t.Errorf("%s: racer %d: %v, want %v", race, i, err, loser)
		}
	}
	if winner < 0 {
		t.Fatalf("%s: no racer won", race)
	}
	return winner, losers
}
