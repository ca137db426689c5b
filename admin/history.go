package admin

import (
	"context"
	"sync"
	"time"
)

// The first screen's history: the admin service samples the projections
// and the relay itself, so a console opened (or reloaded) shows the last
// hour at once, where a page that sampled for itself began empty each
// time. Samples stay in memory, 720 of about 300 bytes per projection:
// an API instance's restart loses them, which Prometheus (the same
// figures, exported at /metrics) is there to keep longer.

const (
	historyInterval = 5 * time.Second
	historyWindow   = time.Hour
)

// history is the samples kept, oldest first.
type history struct {
	mu        sync.Mutex
	samples   []HistorySample
	prevFloor map[string]uint64 // each projection's ack floor at the previous sample
	prevAt    time.Time
}

// RunHistory samples the projections and the relay every 5 s until ctx
// ends, keeping the last hour for History. A sample that fails (the
// store unreachable) is left out: the chart shows a gap.
func (a *Service) RunHistory(ctx context.Context) error {
	tick := time.NewTicker(historyInterval)
	defer tick.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, historyInterval)
		a.sample(sctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sample takes one sample.
func (a *Service) sample(ctx context.Context) {
	ps, err := a.Projections(ctx)
	if err != nil {
		return
	}
	relay, err := a.Relay(ctx)
	if err != nil {
		return
	}
	now := time.Now().UTC()
	h := &a.history
	h.mu.Lock()
	defer h.mu.Unlock()
	s := HistorySample{At: now, Projections: make([]ProjectionSample, 0, len(ps))}
	floors := map[string]uint64{}
	for _, p := range ps {
		ps := ProjectionSample{Name: p.Name, Lag: p.ActiveLag, LastError: p.LastError} // what readers read
		for _, part := range p.Partitions {
			if part.LagSeconds != nil && (ps.LagSeconds == nil || *part.LagSeconds > *ps.LagSeconds) {
				v := *part.LagSeconds
				ps.LagSeconds = &v
			}
		}
		if p.AckFloor != nil {
			floors[p.Name] = *p.AckFloor
			if prev, ok := h.prevFloor[p.Name]; ok && *p.AckFloor >= prev && now.After(h.prevAt) {
				rate := float64(*p.AckFloor-prev) / now.Sub(h.prevAt).Seconds()
				ps.ApplyRate = &rate
			}
		}
		s.Projections = append(s.Projections, ps)
	}
	if relay.Owner != "" && relay.LeaseUntil.After(now) {
		s.Relay.Owner = relay.Owner
	}
	if !relay.CheckpointRecordedAt.IsZero() {
		age := max(now.Sub(relay.CheckpointRecordedAt).Seconds(), 0)
		s.Relay.CheckpointAgeSeconds = &age
	}
	s.Relay.Catchups = a.catchups()
	h.prevFloor, h.prevAt = floors, now
	h.samples = append(h.samples, s)
	for len(h.samples) > 0 && now.Sub(h.samples[0].At) > historyWindow {
		h.samples = h.samples[1:]
	}
}

// catchups is this process's orderd_relay_catchups_total, nil when it
// runs no relay (the metric is registered by the relay role only).
func (a *Service) catchups() *float64 {
	if a.cfg.Metrics == nil {
		return nil
	}
	mfs, err := a.cfg.Metrics.Gather()
	if err != nil {
		return nil
	}
	for _, mf := range mfs {
		if mf.GetName() != "orderd_relay_catchups_total" {
			continue
		}
		var n float64
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
		return &n
	}
	return nil
}

// History returns the samples kept, oldest first.
func (a *Service) History(context.Context) (History, error) {
	h := &a.history
	h.mu.Lock()
	defer h.mu.Unlock()
	return History{IntervalSeconds: historyInterval.Seconds(), WindowSeconds: historyWindow.Seconds(),
		Samples: append([]HistorySample{}, h.samples...)}, nil
}

// History is what the admin service sampled of the projections and the
// relay, oldest sample first, one every IntervalSeconds, over the last
// WindowSeconds: kept in the memory of the instance that answers, so it
// starts empty when that instance starts.
type History struct {
	IntervalSeconds float64         `json:"interval_seconds"`
	WindowSeconds   float64         `json:"window_seconds"`
	Samples         []HistorySample `json:"samples"`
}

// HistorySample is one sample: when it was taken, each projection, and
// the relay.
type HistorySample struct {
	At          time.Time          `json:"at"`
	Projections []ProjectionSample `json:"projections"`
	Relay       RelaySample        `json:"relay"`
}

// ProjectionSample is one projection at a sample. Null fields are
// unknown (no NATS connection, or JetStream did not answer).
type ProjectionSample struct {
	Name string `json:"name"`
	// Lag is the messages its consumers have not yet acknowledged,
	// summed over its partitions.
	Lag *uint64 `json:"lag"`
	// LagSeconds is the largest partition's lag in seconds (0 when
	// nothing is pending; see PartitionStatus.LagSeconds).
	LagSeconds *float64 `json:"lag_seconds"`
	// ApplyRate is events per second acknowledged since the previous
	// sample (the change of the ack floor); null in the first sample.
	ApplyRate *float64 `json:"apply_rate"`
	LastError string   `json:"last_error,omitempty"`
}

// RelaySample is the outbox relay at a sample.
type RelaySample struct {
	Owner string `json:"owner,omitempty"` // "" when no instance holds the relay lease
	// CheckpointAgeSeconds is the seconds from the recorded time of the
	// last commit the relay's checkpoint covers to the sample (an idle
	// relay moves it every 30 s); null before any checkpoint.
	CheckpointAgeSeconds *float64 `json:"checkpoint_age_seconds"`
	// Catchups counts the relay's catch-ups from the log since the
	// answering process started (orderd_relay_catchups_total); null when
	// that process runs no relay.
	Catchups *float64 `json:"catchups"`
}
