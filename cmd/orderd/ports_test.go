//go:build !noembed

package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestMain_PortInUse: a port already taken, the REST API's or an embedded
// server's, fails the start at once with an error naming the port and the
// variable that moves it, not after an embedded server's start-up timeout.
func TestMain_PortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	for _, tc := range []struct {
		name, env string
		set       func(*Config)
	}{
		{"http", "ORDERD_HTTP_ADDR", func(c *Config) { c.HTTPAddr = addr }},
		{"embedded NATS", "ORDERD_EMBEDDED_NATS_ADDR", func(c *Config) { c.Embedded.NATSAddr = addr }},
		{"embedded store", "ORDERD_EMBEDDED_STORE_ADDR", func(c *Config) { c.Embedded.StoreAddr = addr }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMain(t, t.TempDir())
			tc.set(&m.Config)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			err := m.Run(ctx)
			_ = m.Close()
			if err == nil || !strings.Contains(err.Error(), "port "+port) || !strings.Contains(err.Error(), tc.env) {
				t.Fatalf("start with %s taken: %v; want an error naming port %s and %s", tc.name, err, port, tc.env)
			}
			t.Logf("refused in %v: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}
