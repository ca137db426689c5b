package http

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3.1 document of the REST API, the source of its
// routes: package api is generated from it (go generate ./http/api) and
// NewServer registers what api.RegisterHandlers names.
//
//go:embed openapi.json
var openAPI []byte

// GetOpenAPI answers GET /openapi.json.
func (s operations) GetOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}
