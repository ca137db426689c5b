//go:build noembed

package main

import "errors"

// dataLock is absent from production builds: they have no data dir.
type dataLock struct{}

func (*dataLock) release()             {}
func (*dataLock) setHTTP(string) error { return nil }

// lockEmbedded refuses, in production builds (-tags noembed), a config
// that leaves a server to embed: they need MONGODB_URI, and NATS_URL
// unless the api role is the only one.
func lockEmbedded(c *Config) (*dataLock, error) {
	r, _ := c.roles()
	if c.Mongo.URI == "" || (c.NATS.URL == "" && r.needsBus()) {
		return nil, errors.New("built without embedded servers (-tags noembed): set MONGODB_URI and NATS_URL (NATS_URL may be left out with -roles api)")
	}
	return nil, nil
}

// startEmbedded starts nothing in production builds.
func (*Main) startEmbedded(*dataLock) error { return nil }
