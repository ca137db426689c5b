package projections

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

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
	parked      *prometheus.GaugeVec

	// Partitions: what this instance owns and applies.
	partApplied *prometheus.CounterVec
	partLag     *prometheus.GaugeVec
	owned       *prometheus.GaugeVec

	// Rebuild progress of this instance, set by the Worker.
	rebuildEvents  *prometheus.GaugeVec
	rebuildStreams *prometheus.GaugeVec
	rebuildRunning *prometheus.GaugeVec

	mu       sync.Mutex
	rebuilds map[string]*rebuildTally // by projection
}

// rebuildTally is this instance's share of a projection's current
// rebuild: the counts of the partitions it ran, and the tasks of any
// rebuild of the projection it is running now.
type rebuildTally struct {
	job     string
	parts   map[string][2]int64 // partition task name: events, streams
	running int
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"projection"})
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"projection"})
	}
	m := &Metrics{
		applied:     vec("orderd_projection_events_applied_total", "Events folded into a read model."),
		duplicates:  vec("orderd_projection_duplicates_skipped_total", "Events skipped because the read model already reflected them."),
		gaps:        vec("orderd_projection_gaps_filled_total", "Streams whose missing events were read from the log."),
		casRetries:  vec("orderd_projection_repairs_total", "Writes redone because a newer version had been attempted (racing writers)."),
		deadLetters: vec("orderd_projection_dead_letters_total", "Events parked in the dead-letter collection."),
		errors:      vec("orderd_projection_errors_total", "Batches that failed and were redelivered."),
		lag: gauge("orderd_projection_consumer_lag",
			"Messages not yet acknowledged by the consumers of the projection's partitions this instance owns (pending plus in flight); sum over instances for the projection's lag."),
		partApplied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderd_projection_partition_events_applied_total",
			Help: "Events folded into a read model by this instance, by partition (rate() is the partition's apply rate)."}, []string{"projection", "partition"}),
		partLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_projection_partition_lag",
			Help: "Messages not yet acknowledged by a partition's consumer, exposed by the partition's owner only (pending plus in flight)."}, []string{"projection", "partition"}),
		owned: gauge("orderd_projection_partitions_owned", "Partitions of the projection whose lease this instance holds."),
		parked: gauge("orderd_projection_dead_letters_parked",
			"Dead letters of the projection now in the dead-letter collection (parked and not yet retried successfully), sampled with the consumer lag."),
		rebuildEvents: gauge("orderd_rebuild_events_done",
			"Events written by this instance's partitions of the projection's current rebuild (kept after it ends, reset when this instance "+
				"takes part in the next one). A partition resumed from another instance counts what that instance wrote too."),
		rebuildStreams: gauge("orderd_rebuild_streams_done",
			"Streams written by this instance's partitions of the projection's current rebuild (kept after it ends, reset when this instance "+
				"takes part in the next one). A partition resumed from another instance counts what that instance wrote too."),
		rebuildRunning: gauge("orderd_rebuild_running",
			"1 while this instance runs a task (plan, partition or finish) of a rebuild of the projection, else 0."),
		rebuilds: map[string]*rebuildTally{},
	}
	reg.MustRegister(m.applied, m.duplicates, m.gaps, m.casRetries, m.deadLetters, m.errors, m.lag, m.parked, m.partApplied, m.partLag, m.owned,
		m.rebuildEvents, m.rebuildStreams, m.rebuildRunning)
	return m
}

// initProjection creates the projection's counters at 0, so they are
// exposed before anything happened and their first increase shows in
// rate() and increase() (a series born at 1 looks unchanged).
func (m *Metrics) initProjection(name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.CounterVec{m.applied, m.duplicates, m.gaps, m.casRetries, m.deadLetters, m.errors} {
		v.WithLabelValues(name)
	}
	m.owned.WithLabelValues(name)
}

// partitionApplied counts n events applied in a partition.
func (m *Metrics) partitionApplied(name string, p, n int) {
	if m != nil {
		m.partApplied.WithLabelValues(name, strconv.Itoa(p)).Add(float64(n))
	}
}

func (m *Metrics) setPartitionLag(name string, p int, n float64) {
	if m != nil {
		m.partLag.WithLabelValues(name, strconv.Itoa(p)).Set(n)
	}
}

// dropPartition removes the lag series of a partition this instance no
// longer owns (its new owner exposes it); the applied counter stays, as
// counters do.
func (m *Metrics) dropPartition(name string, p int) {
	if m != nil {
		m.partLag.DeleteLabelValues(name, strconv.Itoa(p))
	}
}

func (m *Metrics) setOwned(name string, n int) {
	if m != nil {
		m.owned.WithLabelValues(name).Set(float64(n))
	}
}

// initRebuild creates the projection's rebuild gauges (at 0 unless they
// already hold a value), so an instance that can run rebuilds exposes them
// before its first one.
func (m *Metrics) initRebuild(name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.GaugeVec{m.rebuildEvents, m.rebuildStreams, m.rebuildRunning} {
		v.WithLabelValues(name)
	}
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

func (m *Metrics) setDeadLetters(name string, n float64) {
	if m != nil {
		m.parked.WithLabelValues(name).Set(n)
	}
}

// tally returns the projection's tally for job, starting afresh (progress
// gauges at 0) when job is not the one it counted. m.mu is held.
func (m *Metrics) tally(projection, job string) *rebuildTally {
	t := m.rebuilds[projection]
	if t == nil {
		t = &rebuildTally{}
		m.rebuilds[projection] = t
	}
	if t.job != job {
		t.job, t.parts = job, map[string][2]int64{}
		m.rebuildEvents.WithLabelValues(projection).Set(0)
		m.rebuildStreams.WithLabelValues(projection).Set(0)
	}
	return t
}

// rebuildTaskStarted records that this instance starts a task of the
// rebuild job of projection; a job other than the one counted so far
// starts the progress afresh.
func (m *Metrics) rebuildTaskStarted(projection, job string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tally(projection, job)
	t.running++
	m.rebuildRunning.WithLabelValues(projection).Set(1)
}

// rebuildTaskEnded records that a task of a rebuild of projection ended
// (of whichever job: the next may have started meanwhile).
func (m *Metrics) rebuildTaskEnded(projection string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.rebuilds[projection]
	if t == nil {
		return
	}
	t.running = max(t.running-1, 0)
	if t.running == 0 {
		m.rebuildRunning.WithLabelValues(projection).Set(0)
	}
}

// rebuildPartition records a partition's counts as last checkpointed.
func (m *Metrics) rebuildPartition(projection, job, partition string, events, streams int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tally(projection, job)
	t.parts[partition] = [2]int64{events, streams}
	var ev, st int64
	for _, c := range t.parts {
		ev, st = ev+c[0], st+c[1]
	}
	m.rebuildEvents.WithLabelValues(projection).Set(float64(ev))
	m.rebuildStreams.WithLabelValues(projection).Set(float64(st))
}
