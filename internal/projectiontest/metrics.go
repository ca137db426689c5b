package projectiontest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MustGather gathers reg, failing the test on an error.
func MustGather(t *testing.T, reg *prometheus.Registry) []*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	return mfs
}

// Metric reads a projection's counter or gauge from reg (0 when absent).
func Metric(t *testing.T, reg *prometheus.Registry, name, projection string) float64 {
	t.Helper()
	for _, mf := range MustGather(t, reg) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projection" && l.GetValue() == projection {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// LogMetrics logs every counter and gauge of a projection.
func LogMetrics(t *testing.T, reg *prometheus.Registry, projection string) {
	t.Helper()
	var parts []string
	for _, mf := range MustGather(t, reg) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projection" && l.GetValue() == projection {
					v := m.GetGauge().GetValue()
					if c := m.GetCounter(); c != nil {
						v = c.GetValue()
					}
					parts = append(parts, fmt.Sprintf("%s=%v", strings.TrimPrefix(mf.GetName(), "orderd_projection_"), v))
				}
			}
		}
	}
	t.Logf("%s: %s", projection, strings.Join(parts, " "))
}

// Series counts the series of the metric family name in reg.
func Series(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	for _, mf := range MustGather(t, reg) {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}
