// Package api is generated from the OpenAPI document of the REST API,
// ../openapi.json, which is the API's one source: the echo
// ServerInterface, one method per operation, with RegisterHandlers, which
// registers the document's routes and binds their path and query
// parameters (package http implements it); and the Client that builds each
// operation's request (package http's Client sends it and decodes the
// answer). overlay.yaml says what the generator sees differently from the
// served document, and why.
//
// Do not edit api.gen.go: change the document and run go generate
// ./http/api. make lint-api fails while api.gen.go is not what the
// document generates.
package api

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml -o api.gen.go ../openapi.json
