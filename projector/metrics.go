package projector

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// Metrics are the projectors' Prometheus metrics, labelled by projection:
// consumer lag, partitions, dead letters and failed batches. What the
// writes did is counted by package projection's Metrics.
type Metrics struct {
	deadLetters *prometheus.CounterVec
	errors      *prometheus.CounterVec
	lag         *prometheus.GaugeVec
	parked      *prometheus.GaugeVec

	// Partitions: what this instance owns and applies.
	partApplied *prometheus.CounterVec
	partLag     *prometheus.GaugeVec
	partLagSecs *prometheus.GaugeVec
	owned       *prometheus.GaugeVec
	age         *prometheus.HistogramVec
}

// NewMetrics registers the metrics with reg; it panics if reg already
// holds one of their names, as prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deadLetters: projection.NewCounterVec("orderd_projection_dead_letters_total", "Events parked in the dead-letter collection."),
		errors:      projection.NewCounterVec("orderd_projection_errors_total", "Batches that failed and were redelivered."),
		lag: projection.NewGaugeVec("orderd_projection_consumer_lag",
			"Messages not yet acknowledged by the consumers of the projection's partitions this instance owns (pending plus in flight); sum over instances for the projection's lag."),
		partApplied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderd_projection_partition_events_applied_total",
			Help: "Events folded into a read model by this instance, by partition (rate() is the partition's apply rate)."}, []string{"projection", "partition"}),
		partLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_projection_partition_lag",
			Help: "Messages not yet acknowledged by a partition's consumer, exposed by the partition's owner only (pending plus in flight)."}, []string{"projection", "partition"}),
		partLagSecs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_projection_lag_seconds",
			Help: "Seconds a partition's read-model documents may be behind, exposed by the partition's owner only: 0 when nothing is pending, else the time since the newest event the partition applied was recorded."}, []string{"projection", "partition"}),
		owned: projection.NewGaugeVec("orderd_projection_partitions_owned", "Partitions of the projection JetStream delivers to this instance (its pinned client)."),
		parked: projection.NewGaugeVec("orderd_projection_dead_letters_parked",
			"Dead letters of the projection now in the dead-letter collection (parked and not yet retried successfully), sampled with the consumer lag."),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "orderd_projection_event_age_seconds",
			Help:    "Seconds from an event's recorded time to when this process received its message (stage delivered) and to when the batch holding it was written to the read model (stage applied); one observation per event of a batch written, redeliveries included. Projections fed by log position (the rollup) are not counted.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 36)}, []string{"projection", "stage"}),
	}
	reg.MustRegister(m.deadLetters, m.errors, m.lag, m.parked, m.partApplied, m.partLag, m.partLagSecs, m.owned, m.age)
	return m
}

// partitionApplied counts n events applied in a partition.
func (m *Metrics) partitionApplied(name string, p, n int) {
	m.partApplied.WithLabelValues(name, strconv.Itoa(p)).Add(float64(n))
}

// observeAges records the ages of events, which arrived at the given
// times, now that their batch is written.
func (m *Metrics) observeAges(name string, events []domain.Event, arrived []time.Time) {
	delivered, applied, now := m.age.WithLabelValues(name, "delivered"), m.age.WithLabelValues(name, "applied"), time.Now()
	for i, e := range events {
		delivered.Observe(arrived[i].Sub(e.RecordedAt).Seconds())
		applied.Observe(now.Sub(e.RecordedAt).Seconds())
	}
}
