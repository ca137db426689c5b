package projector

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// LagWatch samples the lag of projections from JetStream, whichever
// processes run them: every interval it reads each Runner's partition
// consumers, as Runner.PartitionStatus does, and sums, per projection,
// what they have not acknowledged (pending plus in flight), and their
// ack floors, whose change over time is the rate at which the projection
// applies, and, per projection, the largest partition lag in seconds (see
// secondsBehind). The Runners need not run in this process. An API instance
// uses it to refuse commands while the read models are too far behind
// (package http's Config.Lag and MaxLag) and to tell readers how fresh
// the read models are (LagSeconds).
type LagWatch struct {
	runners  []*Runner
	interval time.Duration
	log      *slog.Logger

	mu   sync.Mutex
	last LagSample
	prev LagSample
}

// LagSample is one reading of a LagWatch.
type LagSample struct {
	At  time.Time
	Lag map[string]uint64 // messages not acknowledged, by projection
	// Seconds is the largest partition lag in seconds, by projection;
	// absent when a lagging partition's could not be read.
	Seconds map[string]float64
	// acked sums, by projection, its consumers' ack floors; absent when
	// one of them did not answer.
	acked map[string]uint64
}

// NewLagWatch watches the consumers of the runners' projections, reading
// them every interval and logging to log (not nil) when they cannot be
// read.
func NewLagWatch(runners []*Runner, interval time.Duration, log *slog.Logger) *LagWatch {
	return &LagWatch{runners: runners, interval: interval, log: log}
}

// Run samples until ctx is done; it returns nil then. A failed reading
// is logged and leaves the last sample as it was (it ages: see Latest).
func (w *LagWatch) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, w.interval)
		s, err := w.read(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			w.log.Warn("projection lag not readable; commands are admitted without it", "err", err)
			failing = true
		case err == nil:
			if failing {
				w.log.Info("projection lag readable again")
			}
			failing = false
			w.mu.Lock()
			w.prev, w.last = w.last, s
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// read reads every runner's consumers once. A consumer no process has
// created yet counts nothing. A consumer that does not answer (its
// leader being elected) leaves its projection's lag at what the others
// answered, a lower bound, and its lag in seconds unknown: an error only
// when none of a projection's consumers answered.
func (w *LagWatch) read(ctx context.Context) (LagSample, error) {
	s := LagSample{Lag: map[string]uint64{}, Seconds: map[string]float64{}, acked: map[string]uint64{}}
	for _, r := range w.runners {
		infos, err := r.consumers(ctx)
		if err != nil && len(infos) == 0 {
			return s, err
		}
		secs := r.secondsBehind(ctx, infos)
		top, known, acked := 0.0, err == nil, uint64(0)
		for p, info := range infos {
			s.Lag[r.name] += unacked(info)
			acked += info.AckFloor.Consumer
			behind, ok := secs[p]
			top, known = max(top, behind), known && ok
		}
		if err == nil {
			s.acked[r.name] = acked
		}
		if known && len(infos) > 0 {
			s.Seconds[r.name] = top
		}
	}
	s.At = time.Now()
	return s, nil
}

// Latest returns the largest lag among the projections in the last
// sample, the projection that has it, the rate in events per second at
// which that projection applied between the last two samples (0 when
// unknown), and whether the sample is fresh: taken within three
// intervals. A stale or missing sample says nothing about the lag.
func (w *LagWatch) Latest() (lag uint64, projection string, rate float64, fresh bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last.At.IsZero() || time.Since(w.last.At) > 3*w.interval {
		return 0, "", 0, false
	}
	for _, r := range w.runners {
		if n := w.last.Lag[r.name]; n > lag || projection == "" {
			lag, projection = n, r.name
		}
	}
	now, ok := w.last.acked[projection]
	before, okBefore := w.prev.acked[projection]
	if dt := w.last.At.Sub(w.prev.At).Seconds(); ok && okBefore && dt > 0 && now >= before {
		rate = float64(now-before) / dt
	}
	return lag, projection, rate, true
}

// LagSeconds returns the largest lag in seconds among the partitions of
// projection name in the last sample, and whether that sample is fresh
// (see Latest) and has it.
func (w *LagWatch) LagSeconds(name string) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last.At.IsZero() || time.Since(w.last.At) > 3*w.interval {
		return 0, false
	}
	secs, ok := w.last.Seconds[name]
	return secs, ok
}
