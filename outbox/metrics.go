package outbox

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's Prometheus metrics.
type Metrics struct {
	published     prometheus.Counter
	publishErrors prometheus.Counter
	catchUps      prometheus.Counter
	lastCatchUp   prometheus.Gauge
	leader        prometheus.Gauge
	checkpoint    prometheus.Gauge
	age           *prometheus.HistogramVec

	mu     sync.Mutex
	rounds []*round // the tail's rounds in flight, oldest first; those acknowledged are not counted
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_published_events_total", Help: "Events the relay published and JetStream acknowledged."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_publish_errors_total", Help: "Failed relay publish rounds and reads of the positions the bus holds, and commits this build cannot read (not published)."}),
		catchUps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_relay_catchups_total", Help: "Times the relay's change stream could not resume from its checkpoint and the relay caught up from the log."}),
		lastCatchUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_last_catchup_timestamp_seconds", Help: "When the relay last caught up from the log, in Unix seconds (0: never, since this process started)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_leader", Help: "1 while this instance holds the relay lease and tails the log."}),
		checkpoint: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "orderd_relay_checkpoint_recorded_timestamp_seconds", Help: "Recorded time of the last commit the relay's checkpoint covers (or of an idle checkpoint), in Unix seconds, as this instance last read or saved it."}),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "orderd_relay_commit_age_seconds", Help: "Seconds from a commit's recorded time to when the relay's tail read it (stage read) and to when JetStream acknowledged its events (stage acknowledged); one observation per commit, none for a catch-up from the log.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 36)}, []string{"stage"}),
	}
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "orderd_relay_lag_seconds", Help: "Age of the oldest commit this instance's relay read from the log and JetStream has not yet acknowledged, in seconds; 0 when idle."},
		func() float64 {
			_, oldest := m.snapshot()
			if oldest.IsZero() {
				return 0
			}
			return max(0, time.Since(oldest).Seconds())
		})
	behind := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "orderd_relay_commits_behind", Help: "Commits this instance's relay read from the log and JetStream has not yet acknowledged."},
		func() float64 {
			n, _ := m.snapshot()
			return float64(n)
		})
	reg.MustRegister(m.published, m.publishErrors, m.catchUps, m.lastCatchUp, m.leader, m.checkpoint, m.age, lag, behind)
	return m
}

// snapshot returns the commits read and not yet acknowledged, and the
// recorded time of the oldest of them (zero when none): the rounds in
// flight but those whose acks are in, also before the tail has taken
// them (it does at its next batch, up to a second after the last).
func (m *Metrics) snapshot() (behind int, oldest time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rd := range m.rounds {
		if rd.acked.Load() {
			continue
		}
		if oldest.IsZero() {
			oldest = rd.first
		}
		behind += rd.commits
	}
	return behind, oldest
}

// Stages of a commit's way through the relay (orderd_relay_commit_age_seconds).
const (
	stageRead         = "read"
	stageAcknowledged = "acknowledged"
)

// observeAge records, for each commit recorded at one of recorded, its
// age now at stage.
func (m *Metrics) observeAge(stage string, recorded []time.Time) {
	o, now := m.age.WithLabelValues(stage), time.Now()
	for _, at := range recorded {
		o.Observe(now.Sub(at).Seconds())
	}
}

func (m *Metrics) setLeader(on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.leader.Set(v)
}

func (m *Metrics) setCheckpoint(at time.Time) {
	if !at.IsZero() {
		m.checkpoint.Set(float64(at.UnixMilli()) / 1000)
	}
}

// setBehind records the tail's rounds in flight, oldest first (nil: none).
func (m *Metrics) setBehind(rounds []*round) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rounds = slices.Clone(rounds)
}
