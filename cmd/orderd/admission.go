package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/projector"
)

// lagAdmission refuses commands while the slowest read model is more than
// maxLag events behind (http.Admission): a store that cannot take the
// commands and their projection both would otherwise accept writes faster
// than it projects them, and the lag would grow until the load stopped.
// The client is told to come back once the excess should have drained at
// the rate the projection applied in the last sample (1-30 s). Without a
// fresh lag sample (NATS unreachable or electing, say) every command is
// admitted: the log is the buffer, and the relay publishes it once the bus
// answers again.
type lagAdmission struct {
	watch  *projector.LagWatch
	maxLag uint64
}

func newLagAdmission(w *projector.LagWatch, maxLag int, reg prometheus.Registerer) *lagAdmission {
	a := &lagAdmission{watch: w, maxLag: uint64(maxLag)}
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "orderd_admission_projection_lag",
		Help: "Events the slowest read model had not applied at this API instance's last sample (-1 without a fresh one); above orderd_admission_max_lag it refuses commands (orderd_commands_total{outcome=\"read-models-behind\"})."},
		func() float64 {
			if n, _, _, fresh := w.Latest(); fresh {
				return float64(n)
			}
			return -1
		})
	limit := prometheus.NewGauge(prometheus.GaugeOpts{Name: "orderd_admission_max_lag",
		Help: "Events the slowest read model may be behind before this API instance refuses commands (ORDERD_MAX_LAG)."})
	limit.Set(float64(maxLag))
	reg.MustRegister(lag, limit)
	return a
}

// Admit implements http.Admission.
func (a *lagAdmission) Admit() (bool, time.Duration, string) {
	lag, name, rate, fresh := a.watch.Latest()
	if !fresh || lag <= a.maxLag {
		return true, 0, ""
	}
	after := 2 * time.Second
	if rate > 0 {
		after = time.Duration(float64(lag-a.maxLag) / rate * float64(time.Second))
	}
	after = min(max(after, time.Second), 30*time.Second)
	return false, after, fmt.Sprintf("read model %s is %d events behind, more than the %d this service takes commands at (ORDERD_MAX_LAG); retry in %v",
		name, lag, a.maxLag, after.Round(time.Second))
}
