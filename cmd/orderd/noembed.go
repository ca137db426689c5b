//go:build noembed

package main

import (
	"errors"
	"log/slog"
)

// startEmbedded is absent from production builds (-tags noembed): they need
// MONGODB_URI, and NATS_URL unless the api role is the only one.
func startEmbedded(c *Config, _ *slog.Logger, _ string) (func(), any, error) {
	r, _ := c.roles()
	if c.Mongo.URI == "" || (c.NATS.URL == "" && r.needsBus()) {
		return func() {}, nil, errors.New("built without embedded servers (-tags noembed): set MONGODB_URI and NATS_URL (NATS_URL may be left out with -roles api)")
	}
	return func() {}, nil, nil
}
