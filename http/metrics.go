package http

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
)

type metrics struct {
	commands *prometheus.CounterVec
	retries  prometheus.Counter
	duration *prometheus.HistogramVec
	seen     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderd_commands_total",
			Help: "Commands handled, by command and outcome (accepted, replayed, or the problem type)."}, []string{"command", "outcome"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "orderd_command_retries_total",
			Help: "Server-side retries of commands that lost a version race."}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "orderd_command_duration_seconds",
			Help: "Command latency from decode to answer, in seconds.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)},
			[]string{"command"}),
		seen: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "orderd_summary_event_age_seconds",
			Help:    "Seconds from the recorded time of a summary's newest event to the answer of a read that waited for it (GET /v1/order-summaries/{id}?min_version=N found the summary older than N, then at N or later).",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 60, 36)}),
	}
	reg.MustRegister(m.commands, m.retries, m.duration, m.seen)
	return m
}

func (m *metrics) command(name string, res domain.Result, err error, d time.Duration) {
	outcome := "accepted"
	switch {
	case err != nil:
		outcome = "error"
		for _, c := range codes {
			if errors.Is(err, c.err) {
				outcome = c.slug
				break
			}
		}
	case res.Replayed:
		outcome = "replayed"
	}
	m.commands.WithLabelValues(name, outcome).Inc()
	if res.Attempts > 1 {
		m.retries.Add(float64(res.Attempts - 1))
	}
	m.duration.WithLabelValues(name).Observe(d.Seconds())
}
