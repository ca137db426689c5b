package http

import (
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/projection"
)

// ProjectionLag is how far behind the projections are (projector.LagWatch),
// from a sample taken in the background: its answers never wait.
// LagSeconds returns the largest lag in seconds over the named
// projection's partitions; Latest the largest lag in events among the
// projections, the projection that has it and the rate in events per
// second at which it applied lately (0 when unknown). Both return false
// without a fresh sample.
type ProjectionLag interface {
	LagSeconds(projection string) (seconds float64, fresh bool)
	Latest() (lag uint64, projection string, rate float64, fresh bool)
}

// The freshness headers of read-model answers: Read-Model-Version is the
// stream version a single document reflects; Read-Model-Age the seconds
// since the newest event applied to the answered documents was recorded
// (absent when none of them carries its recorded_at); Read-Model-Lag the
// projection's lag in seconds (absent without a fresh sample).
const (
	headerVersion = "Read-Model-Version"
	headerAge     = "Read-Model-Age"
	headerLag     = "Read-Model-Lag"
)

// freshness sets Read-Model-Age from newest, the latest recorded_at of the
// answered documents (zero: unknown), and Read-Model-Lag from the lag of
// projection name.
func (s *Server) freshness(c echo.Context, name string, newest time.Time) {
	h := c.Response().Header()
	if !newest.IsZero() {
		h.Set(headerAge, seconds(time.Since(newest)))
	}
	if s.cfg.Lag == nil {
		return
	}
	if lag, fresh := s.cfg.Lag.LagSeconds(name); fresh {
		h.Set(headerLag, seconds(time.Duration(lag*float64(time.Second))))
	}
}

// seconds formats d as seconds with millisecond decimals, 0 for a
// negative d (the clocks of the instance that recorded and of this one
// differ).
func seconds(d time.Duration) string {
	return strconv.FormatFloat(max(d, 0).Seconds(), 'f', 3, 64)
}

// summariesName is the projection every read-model answer comes from:
// the order summaries, and the stats and daily sales summed from them.
var summariesName = projection.OrderSummaries.Name
