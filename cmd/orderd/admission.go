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
// fresh lag sample (NATS unreachable, say) every command is admitted: the
// log keeps what the relay publishes later.
//
// Events this instance appended but its relay has not yet published are
// not in that lag: when the relay's queues are half full (its published
// markers fall behind the store's other writes, say), commands are
// refused too, for a second at a time, before appends overflow the queue
// and wait seconds for the sweep; but not while NATS is unreachable (the
// relay's connection is down, or no fresh sample), when the queues fill
// because nothing can be published and commands are taken as before.
type lagAdmission struct {
	watch     *projector.LagWatch
	maxLag    uint64
	relay     func() float64 // the relay's Backlog; nil without one
	connected func() bool    // whether the relay's NATS connection is up
}

// relayBacklogLimit is the share of the relay's queues filled at which
// commands are refused.
const relayBacklogLimit = 0.5

// lagByName answers the read routes' Read-Model-Lag by projection name
// from a watch of the consumers of the versions this process folds (keys,
// projection.Definition.Key).
type lagByName struct {
	w    *projector.LagWatch
	keys map[string]string // projection name -> key
}

func (l lagByName) LagSeconds(name string) (float64, bool) { return l.w.LagSeconds(l.keys[name]) }

func newLagAdmission(w *projector.LagWatch, maxLag int, relay func() float64, connected func() bool, reg prometheus.Registerer) *lagAdmission {
	a := &lagAdmission{watch: w, maxLag: uint64(maxLag), relay: relay, connected: connected}
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
	if !fresh {
		// NATS is not answering: the relay's queues fill for that reason,
		// and the log keeps the commands until it answers again.
		return true, 0, ""
	}
	// A sample stays fresh for seconds after NATS went away: the relay's
	// connection tells at once.
	if a.relay != nil && a.connected() {
		if f := a.relay(); f >= relayBacklogLimit {
			return false, time.Second, fmt.Sprintf("this instance's relay has its queues %.0f%% full: its appends wait to be published or marked; retry in 1s", 100*f)
		}
	}
	if lag <= a.maxLag {
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
