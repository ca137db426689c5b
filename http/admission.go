package http

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// admit refuses a command while the slowest read model is more than
// Config.MaxLag events behind (Config.Lag's last sample): a store that
// cannot take the commands and their projection both would otherwise
// accept writes faster than it projects them, and the lag would grow
// until the load stopped. The refusal is 503 /problems/read-models-behind
// with Retry-After in whole seconds, 1 to 30: when the excess should have
// drained at the rate the projection applied in the last sample (2 s
// without one). Without a fresh sample (NATS unreachable or electing,
// say) every command is admitted: the log is the buffer, and the relay
// publishes it once the bus answers again. It is asked after the request
// was decoded and validated, so bad input is refused as such whatever
// the load.
func (s *Server) admit(c echo.Context) error {
	if s.cfg.Lag == nil || s.cfg.MaxLag <= 0 {
		return nil
	}
	maxLag := uint64(s.cfg.MaxLag)
	lag, name, rate, fresh := s.cfg.Lag.Latest()
	if !fresh || lag <= maxLag {
		return nil
	}
	after := 2 * time.Second
	if rate > 0 {
		after = time.Duration(float64(lag-maxLag) / rate * float64(time.Second))
	}
	after = min(max(after, time.Second), 30*time.Second)
	c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(after.Seconds()))))
	return &problemError{status: http.StatusServiceUnavailable, slug: "read-models-behind",
		detail: fmt.Sprintf("read model %s is %d events behind, more than the %d this service takes commands at (ORDERD_MAX_LAG); retry in %v",
			name, lag, maxLag, after.Round(time.Second))}
}

// registerAdmission registers the gauges of the admission: the lag of its
// last sample and its limit.
func registerAdmission(reg prometheus.Registerer, lag ProjectionLag, maxLag int) {
	sampled := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "orderd_admission_projection_lag",
		Help: "Events the slowest read model had not applied at this API instance's last sample (-1 without a fresh one); above orderd_admission_max_lag it refuses commands (orderd_commands_total{outcome=\"read-models-behind\"})."},
		func() float64 {
			if n, _, _, fresh := lag.Latest(); fresh {
				return float64(n)
			}
			return -1
		})
	limit := prometheus.NewGauge(prometheus.GaugeOpts{Name: "orderd_admission_max_lag",
		Help: "Events the slowest read model may be behind before this API instance refuses commands (ORDERD_MAX_LAG)."})
	limit.Set(float64(maxLag))
	reg.MustRegister(sampled, limit)
}
