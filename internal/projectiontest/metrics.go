package projectiontest

import (
	"fmt"
	"maps"
	"slices"
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
	return values(t, reg, projection)[name]
}

// LogMetrics logs every counter and gauge of a projection.
func LogMetrics(t *testing.T, reg *prometheus.Registry, projection string) {
	t.Helper()
	vs := values(t, reg, projection)
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(vs)) {
		parts = append(parts, fmt.Sprintf("%s=%v", strings.TrimPrefix(name, "orderd_projection_"), vs[name]))
	}
	t.Logf("%s: %s", projection, strings.Join(parts, " "))
}

// values returns the value of each counter and gauge of reg by name, of
// its first series labelled with projection.
func values(t *testing.T, reg *prometheus.Registry, projection string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range MustGather(t, reg) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if _, seen := out[mf.GetName()]; !seen && l.GetName() == "projection" && l.GetValue() == projection {
					out[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue() // one of them is nil: 0
				}
			}
		}
	}
	return out
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
