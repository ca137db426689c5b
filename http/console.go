package http

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/orderd/orderd/http/console"
)

// consoleRoutes registers the operator console's static files (package
// console) under /console/, with the admin routes it uses: without a
// token there is nothing for it to show. The files are public and hold
// no data; the script sends the token on each admin API request.
func (s *Server) consoleRoutes() {
	if s.cfg.Admin == nil || s.cfg.AdminToken == "" {
		return
	}
	h := echo.WrapHandler(console.Handler())
	for _, p := range console.Paths() {
		s.echo.GET(p, h)
	}
	// The address people type: the console's relative links need the slash.
	s.echo.GET(strings.TrimSuffix(console.Prefix, "/"), func(c echo.Context) error {
		return c.Redirect(http.StatusMovedPermanently, console.Prefix)
	})
}
