package jobs

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/projection"
)

// Metrics are the rebuild progress of this instance as Prometheus gauges,
// labelled by projection. A nil *Metrics records nothing.
type Metrics struct {
	rebuildEvents  *prometheus.GaugeVec
	rebuildStreams *prometheus.GaugeVec
	rebuildRunning *prometheus.GaugeVec
	versions       *prometheus.GaugeVec

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
	m := &Metrics{
		rebuildEvents: projection.NewGaugeVec("orderd_rebuild_events_done",
			"Events written by this instance's partitions of the projection's current rebuild (kept after it ends, reset when this instance "+
				"takes part in the next one). A partition resumed from another instance counts what that instance wrote too."),
		rebuildStreams: projection.NewGaugeVec("orderd_rebuild_streams_done",
			"Streams written by this instance's partitions of the projection's current rebuild (kept after it ends, reset when this instance "+
				"takes part in the next one). A partition resumed from another instance counts what that instance wrote too."),
		rebuildRunning: projection.NewGaugeVec("orderd_rebuild_running",
			"1 while this instance runs a task (plan, partition or finish) of a rebuild of the projection, else 0."),
		versions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "orderd_projection_version",
			Help: "Versions of the projection's definition: role=\"definition\" is the one this instance folds; \"active\" the one readers read, " +
				"\"building\" one a rebuild builds, \"previous\" the one kept for a switch back, as this instance last read the pointer " +
				"(0: none). Exposed by instances with the jobs role."}, []string{"projection", "role"}),
		rebuilds: map[string]*rebuildTally{},
	}
	reg.MustRegister(m.rebuildEvents, m.rebuildStreams, m.rebuildRunning, m.versions)
	return m
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

// pointer records the versions a projection's pointer names, beside the
// one this instance folds.
func (m *Metrics) pointer(name string, definition int, p projection.Pointer) {
	if m == nil {
		return
	}
	for role, v := range map[string]int{"definition": definition, "active": p.ActiveVer(), "building": p.ShadowVer(), "previous": p.PreviousVer()} {
		m.versions.WithLabelValues(name, role).Set(float64(v))
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
