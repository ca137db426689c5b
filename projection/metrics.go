package projection

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the read models' Prometheus metrics, all counters labelled
// by projection: what the writes of a ReadModel did. The metrics of what
// feeds them (lag, partitions, dead letters) are package projector's. A
// nil *Metrics records nothing.
type Metrics struct {
	applied    *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	gaps       *prometheus.CounterVec
	superseded *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg; it panics if reg already
// holds one of their names, as prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		applied:    NewCounterVec("orderd_projection_events_applied_total", "Events folded into a read model."),
		duplicates: NewCounterVec("orderd_projection_duplicates_skipped_total", "Events skipped because the read model already reflected them."),
		gaps:       NewCounterVec("orderd_projection_gaps_filled_total", "Streams whose missing events were read from the log."),
		superseded: NewCounterVec("orderd_projection_writes_superseded_total", "Writes the version guard refused because the read model already held a newer version (racing or late writers)."),
	}
	reg.MustRegister(m.applied, m.duplicates, m.gaps, m.superseded)
	return m
}

// NewCounterVec is a counter labelled by projection, as every metric of the
// read models is, and those of their projectors and rebuilds.
func NewCounterVec(name, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"projection"})
}

// NewGaugeVec is a gauge labelled by projection (see NewCounterVec).
func NewGaugeVec(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"projection"})
}

// Init creates the projection's counters at 0, so they are
// exposed before anything happened and their first increase shows in
// rate() and increase() (a series born at 1 looks unchanged).
func (m *Metrics) Init(name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.CounterVec{m.applied, m.duplicates, m.gaps, m.superseded} {
		v.WithLabelValues(name)
	}
}

// Record counts what an Apply of projection name did.
func (m *Metrics) Record(name string, o Outcome) {
	if m == nil {
		return
	}
	m.applied.WithLabelValues(name).Add(float64(o.Applied))
	m.duplicates.WithLabelValues(name).Add(float64(o.Duplicates))
	m.gaps.WithLabelValues(name).Add(float64(o.GapsFilled))
	m.superseded.WithLabelValues(name).Add(float64(o.Superseded))
}
