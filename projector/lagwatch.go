package projector

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LagWatch samples the lag of projections from JetStream, whichever
// processes run them: every interval it lists the stream's consumers (one
// paged request, not one per partition) and sums, per projection, what its
// partitions' consumers ("proj_<name>_pNN", or a sequenced projection's
// one "proj_<name>") have not acknowledged
// (pending plus in flight), and their ack floors, whose change over time
// is the rate at which the projection applies, and, per projection, the
// largest partition lag in seconds (see lagClock; one message read per
// lagging partition whose ack floor moved). An API instance uses it to
// refuse commands while the read models are too far behind (Admission)
// and to tell readers how fresh the read models are (LagSeconds).
type LagWatch struct {
	js          jetstream.JetStream
	stream      string
	projections []string
	interval    time.Duration
	log         *slog.Logger
	clock       *lagClock

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
	// acked sums, by projection, its consumers' ack floors.
	acked map[string]uint64
}

// NewLagWatch watches the named projections' consumers on stream,
// reading them every interval.
func NewLagWatch(js jetstream.JetStream, stream string, projections []string, interval time.Duration, log *slog.Logger) *LagWatch {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LagWatch{js: js, stream: stream, projections: projections, interval: interval, log: log, clock: newLagClock()}
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

// read lists the stream's consumers once.
func (w *LagWatch) read(ctx context.Context) (LagSample, error) {
	s := LagSample{Lag: map[string]uint64{}, Seconds: map[string]float64{}, acked: map[string]uint64{}}
	st, err := w.js.Stream(ctx, w.stream)
	if err != nil {
		return s, fmt.Errorf("stream %s: %w", w.stream, err)
	}
	now := time.Now()
	// The listing first, whole: the seconds below read messages, and a
	// slow read must not hold the listing's pages past its deadline (the
	// counts are the sample; seconds it cannot read are left unknown).
	type found struct {
		projection string
		info       *jetstream.ConsumerInfo
	}
	var consumers []found
	ls := st.ListConsumers(ctx)
	for info := range ls.Info() {
		for _, p := range w.projections {
			if info.Name == "proj_"+p || strings.HasPrefix(info.Name, "proj_"+p+"_p") {
				s.Lag[p] += unacked(info)
				s.acked[p] += info.AckFloor.Consumer
				consumers = append(consumers, found{p, info})
			}
		}
	}
	if err := ls.Err(); err != nil {
		return s, fmt.Errorf("consumers of %s: %w", w.stream, err)
	}
	unknown := map[string]bool{}
	for _, c := range consumers {
		secs, err := w.clock.seconds(ctx, st, c.info, now)
		if err != nil {
			unknown[c.projection] = true
		}
		s.Seconds[c.projection] = max(s.Seconds[c.projection], secs)
	}
	for p := range unknown {
		delete(s.Seconds, p)
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
	for _, p := range w.projections {
		if n := w.last.Lag[p]; n > lag || projection == "" {
			lag, projection = n, p
		}
	}
	if dt := w.last.At.Sub(w.prev.At).Seconds(); !w.prev.At.IsZero() && dt > 0 && w.last.acked[projection] >= w.prev.acked[projection] {
		rate = float64(w.last.acked[projection]-w.prev.acked[projection]) / dt
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
