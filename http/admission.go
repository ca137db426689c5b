package http

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
)

// Admission decides, before each command, whether the service takes new
// writes now. Admit answers ok, or how long the client should wait before
// trying again and why (the problem's detail). It is asked after the
// request was decoded and validated, so bad input is refused as such
// whatever the load; it must answer at once (from a sampled state, never
// a round trip).
type Admission interface {
	Admit() (ok bool, retryAfter time.Duration, why string)
}

// admit answers a command the admission refuses with 503
// /problems/read-models-behind and Retry-After in whole seconds (at
// least 1): the service takes no more writes than its read models can
// apply, so a client backs off instead of the lag growing.
func (s *Server) admit(c echo.Context) error {
	if s.cfg.Admission == nil {
		return nil
	}
	ok, after, why := s.cfg.Admission.Admit()
	if ok {
		return nil
	}
	secs := max(1, int(math.Ceil(after.Seconds())))
	c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
	return &problemError{status: http.StatusServiceUnavailable, slug: "read-models-behind", detail: why}
}
