package eventstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the event store's and the relay's Prometheus metrics. A nil
// *Metrics records nothing.
type Metrics struct {
	appendSeconds   prometheus.Histogram
	appendErrors    prometheus.Counter
	conflicts       prometheus.Counter
	published       prometheus.Counter
	publishErrors   prometheus.Counter
	unpublished     prometheus.Gauge
	oldestAgeSecond prometheus.Gauge
	leader          prometheus.Gauge
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderd_append_duration_seconds", Help: "Latency of one commit insert, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		appendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_append_errors_total", Help: "Appends that failed for another reason than a conflict."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_append_conflicts_total", Help: "Appends refused because the stream had moved past the expected version."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_published_events_total", Help: "Events the relay published and JetStream acknowledged."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_publish_errors_total", Help: "Failed relay publish rounds and unacknowledged events."}),
		unpublished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_unpublished_commits", Help: "Unpublished commits seen by the last outbox sweep (at most one batch)."}),
		oldestAgeSecond: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_lag_seconds", Help: "Age of the oldest unpublished commit at the last outbox sweep, in seconds (0 when none)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_leader", Help: "1 while this instance holds the relay lease."}),
	}
	reg.MustRegister(m.appendSeconds, m.appendErrors, m.conflicts, m.published, m.publishErrors,
		m.unpublished, m.oldestAgeSecond, m.leader)
	return m
}

func (m *Metrics) observeAppend(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.appendSeconds.Observe(d.Seconds())
	if err != nil && !isDuplicate(err) {
		m.appendErrors.Inc()
	}
}

func (m *Metrics) conflict() {
	if m != nil {
		m.conflicts.Inc()
	}
}
