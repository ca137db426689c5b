package mongodb

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// EventStoreMetrics are the event log's Prometheus metrics: append latency, failed
// appends, version conflicts and the size of group inserts. A nil *EventStoreMetrics records nothing.
type EventStoreMetrics struct {
	appendSeconds prometheus.Histogram
	appendErrors  prometheus.Counter
	conflicts     prometheus.Counter
	batchSize     prometheus.Histogram
}

// NewEventStoreMetrics registers the metrics with reg.
func NewEventStoreMetrics(reg prometheus.Registerer) *EventStoreMetrics {
	m := &EventStoreMetrics{
		appendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderd_append_duration_seconds", Help: "Latency of one append, from its call to its batch's insert returning, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		appendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_append_errors_total", Help: "Appends that failed for another reason than a conflict."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderd_append_conflicts_total", Help: "Appends refused because the stream had moved past the expected version."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "orderd_append_batch_size", Help: "Commits written by one group insert of appends.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8), // 1 to 128, past MaxAppendBatch
		}),
	}
	reg.MustRegister(m.appendSeconds, m.appendErrors, m.conflicts, m.batchSize)
	return m
}

func (m *EventStoreMetrics) observeAppend(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.appendSeconds.Observe(d.Seconds())
	if err != nil && !mongo.IsDuplicateKeyError(err) { // a lost race, not a failed append
		m.appendErrors.Inc()
	}
}

func (m *EventStoreMetrics) conflict() {
	if m != nil {
		m.conflicts.Inc()
	}
}

func (m *EventStoreMetrics) observeBatch(n int) {
	if m != nil {
		m.batchSize.Observe(float64(n))
	}
}
