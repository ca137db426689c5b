package http

import "github.com/labstack/echo/v4"

// Routes returns the routes registered on the server, including echo's
// internal not-found routes of groups (method echo.RouteNotFound).
func (s *Server) Routes() []*echo.Route { return s.echo.Routes() }
