//go:build noembed

package main

import (
	"errors"
	"log/slog"
)

// startEmbedded is absent from production builds (-tags noembed): they need
// MONGODB_URI and NATS_URL.
func startEmbedded(c *Config, _ *slog.Logger) (func(), error) {
	if c.MongoURI == "" || c.NATSURL == "" {
		return func() {}, errors.New("built without embedded servers (-tags noembed): set MONGODB_URI and NATS_URL")
	}
	return func() {}, nil
}
