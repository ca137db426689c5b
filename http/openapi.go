package http

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3.1 description of every route NewServer
// registers. openapi_test.go checks it against the registered routes: a
// route added, removed or renamed there must be documented here too.
//
//go:embed openapi.json
var openAPI []byte

// openAPIDocument answers GET /openapi.json.
func openAPIDocument(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}

// Routes returns the routes registered on the server, including echo's
// internal not-found routes of groups (method echo.RouteNotFound).
func (s *Server) Routes() []*echo.Route { return s.echo.Routes() }
