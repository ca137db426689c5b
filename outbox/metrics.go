package outbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the outbox relay's Prometheus metrics: the Relay and the
// Sweeper both count what they publish and their failed rounds; the
// outbox gauges and the leader gauge are the Sweeper's. A nil *Metrics
// records nothing.
type Metrics struct {
	published       prometheus.Counter
	publishErrors   prometheus.Counter
	unpublished     prometheus.Gauge
	oldestAgeSecond prometheus.Gauge
	leader          prometheus.Gauge
	leftToSweepN    prometheus.Counter
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_published_events_total", Help: "Events the relay published and JetStream acknowledged."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_publish_errors_total", Help: "Failed relay publish rounds (own appends or sweeps) and undecodable commits."}),
		unpublished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_unpublished_commits", Help: "Unpublished commits older than the sweep grace, seen by this instance's last outbox sweep (at most one batch)."}),
		oldestAgeSecond: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_lag_seconds", Help: "Age of the oldest unpublished commit older than the sweep grace at this instance's last outbox sweep, in seconds (0 when none)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_leader", Help: "1 while this instance holds the relay sweep lease."}),
		leftToSweepN: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_appends_left_to_sweep_total", Help: "Appends the relay of this API instance had no room for, left for the sweep to publish (seconds later)."}),
	}
	reg.MustRegister(m.published, m.publishErrors, m.unpublished, m.oldestAgeSecond, m.leader, m.leftToSweepN)
	return m
}

func (m *Metrics) publishedEvents(n int) {
	if m != nil && n > 0 {
		m.published.Add(float64(n))
	}
}

func (m *Metrics) leftToSweep() {
	if m != nil {
		m.leftToSweepN.Inc()
	}
}

func (m *Metrics) publishError() {
	if m != nil {
		m.publishErrors.Inc()
	}
}

func (m *Metrics) setLeader(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.leader.Set(v)
}

// setOutbox records what a sweep read: the unpublished commits (at most a
// batch, so the gauge reads "at least") and the oldest one's recorded
// time (zero when none).
func (m *Metrics) setOutbox(n int, oldest time.Time) {
	if m == nil {
		return
	}
	m.unpublished.Set(float64(n))
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	m.oldestAgeSecond.Set(age)
}
