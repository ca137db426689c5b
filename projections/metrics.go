package projections

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the projections' Prometheus metrics, labelled by projection.
// A nil *Metrics records nothing.
type Metrics struct {
	applied     *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	gaps        *prometheus.CounterVec
	casRetries  *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	errors      *prometheus.CounterVec
	lag         *prometheus.GaugeVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"projection"})
	}
	m := &Metrics{
		applied:     vec("orderd_projection_events_applied_total", "Events folded into a read model."),
		duplicates:  vec("orderd_projection_duplicates_skipped_total", "Events skipped because the read model already reflected them."),
		gaps:        vec("orderd_projection_gaps_filled_total", "Streams whose missing events were read from the log."),
		casRetries:  vec("orderd_projection_repairs_total", "Writes redone because a newer version had been attempted (racing writers)."),
		deadLetters: vec("orderd_projection_dead_letters_total", "Events parked in the dead-letter collection."),
		errors:      vec("orderd_projection_errors_total", "Batches that failed and were redelivered."),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_projection_consumer_lag",
			Help: "Messages not yet acknowledged by the projection's consumer (pending plus in flight)."}, []string{"projection"}),
	}
	reg.MustRegister(m.applied, m.duplicates, m.gaps, m.casRetries, m.deadLetters, m.errors, m.lag)
	return m
}

func (m *Metrics) outcome(name string, o Outcome) {
	if m == nil {
		return
	}
	m.applied.WithLabelValues(name).Add(float64(o.Applied))
	m.duplicates.WithLabelValues(name).Add(float64(o.Duplicates))
	m.gaps.WithLabelValues(name).Add(float64(o.GapsFilled))
}

func (m *Metrics) repair(name string) {
	if m != nil {
		m.casRetries.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) deadLetter(name string) {
	if m != nil {
		m.deadLetters.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) failed(name string) {
	if m != nil {
		m.errors.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) setLag(name string, n float64) {
	if m != nil {
		m.lag.WithLabelValues(name).Set(n)
	}
}
