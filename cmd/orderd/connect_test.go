//go:build !noembed

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/internal/freeport"
)

// TestMain_UnreachableServers: a store or, for the roles that need the
// bus, a NATS server that nothing answers at fails the start within the
// connect wait, naming the URL (without its password) and the variable
// to change; an api-only instance starts while NATS is down.
func TestMain_UnreachableServers(t *testing.T) {
	dead := func() string { return fmt.Sprintf("127.0.0.1:%d", freeport.Port(t)) }
	for _, tc := range []struct {
		name  string
		set   func(*Config)
		want  []string // in the error; none: the start succeeds
		nowhy string   // never in the error
	}{
		{"store", func(c *Config) {
			c.Mongo.URI = "mongodb://orderd:s3cret@" + dead() + "/"
		}, []string{"MONGODB_URI", "-mongodb-uri", "mongodb://orderd:xxxxx@127.0.0.1:"}, "s3cret"},
		{"nats for the bus roles", func(c *Config) {
			c.NATS.URL = "nats://" + dead()
			c.Roles = "relay,projector,jobs"
		}, []string{"NATS_URL", "-nats-url", "nats://127.0.0.1:"}, ""},
		{"nats for the api role alone", func(c *Config) {
			c.NATS.URL = "nats://" + dead()
			c.Roles = "api"
		}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMain(t, t.TempDir())
			tc.set(&m.Config)
			// A hang guard, not a measure: the wait is connectWait.
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			start := time.Now()
			err := m.Run(ctx)
			_ = m.Close()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("started with the server unreachable")
			}
			if ctx.Err() != nil {
				t.Fatalf("the start waited for the test's deadline: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.nowhy != "" && strings.Contains(err.Error(), tc.nowhy) {
				t.Errorf("error %q shows the password", err)
			}
			t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}
