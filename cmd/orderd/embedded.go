//go:build !noembed

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/google/uuid"

	"github.com/orderd/orderd/internal/embedded"
)

// lockEmbedded takes the data dir's lock (lockDataDir) when c leaves a
// server to embed, which keeps its data under Embedded.DataDir; nil when
// none is embedded. A dir another process holds is an error at once.
func lockEmbedded(c *Config) (*dataLock, error) {
	r, _ := c.roles()
	if c.Mongo.URI != "" && (c.NATS.URL != "" || !r.needsBus()) {
		return nil, nil // no embedded server: the data dir is not used
	}
	return lockDataDir(c.Embedded.DataDir)
}

// startEmbedded starts the embedded servers that the config leaves
// unnamed, with their data under Embedded.DataDir, and fills in their
// URLs; NATS only when a role needs it. In the development mode (devMode)
// it keeps the admin token too. lock is the data dir's (lockEmbedded),
// nil when no server is embedded; m.stopEmbedded stops the servers and
// then releases it. A failed start stops what did start and releases the
// lock at once.
func (m *Main) startEmbedded(lock *dataLock) (err error) {
	c, log := &m.Config, m.Log
	stops := []func(){lock.release}
	m.stopEmbedded = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if lock == nil {
		return nil
	}
	dev := devMode(c) // before the servers' URLs are filled in
	r, _ := c.roles()
	defer func() {
		if err == nil {
			nats := ""
			if r.needsBus() {
				nats = c.NATS.URL
			}
			err = lock.setServers(redact(c.Mongo.URI), nats)
		}
		if err != nil {
			// What did start stops now, the lock last: a failed start
			// holds nothing.
			m.stopEmbedded()
			m.stopEmbedded = func() {}
			err = fmt.Errorf("embedded servers: %w", err)
		}
	}()
	if c.NATS.URL == "" && r.needsBus() {
		host, port, err := splitAddr(c.Embedded.NATSAddr)
		if err != nil {
			return err
		}
		if err := free(c.Embedded.NATSAddr, port, "ORDERD_EMBEDDED_NATS_ADDR", "-embedded-nats-addr"); err != nil {
			return err
		}
		dir := filepath.Join(c.Embedded.DataDir, "nats")
		ns, err := embedded.StartNATS(dir, host, port)
		if err != nil {
			return err
		}
		stops = append(stops, ns.Shutdown)
		c.NATS.URL = ns.ClientURL()
		log.Info("embedded NATS started", "url", c.NATS.URL, "dir", dir)
	}
	if c.Mongo.URI == "" {
		if c.InstanceID == "" {
			// The data dir is this instance's alone (lockDataDir):
			// an id kept there survives a restart, so a restarted process
			// takes back its partition and relay leases at once instead of
			// waiting for them to expire.
			if c.InstanceID, err = keptInstanceID(c.Embedded.DataDir); err != nil {
				return err
			}
		}
		if _, port, err := splitAddr(c.Embedded.StoreAddr); err == nil {
			if err := free(c.Embedded.StoreAddr, port, "ORDERD_EMBEDDED_STORE_ADDR", "-embedded-store-addr"); err != nil {
				return err
			}
		}
		dir := filepath.Join(c.Embedded.DataDir, "store")
		s, err := embedded.StartStore(dir, c.Embedded.StoreAddr, slog.New(warnOnly{log.With("component", "ferretdb").Handler()}))
		if err != nil {
			return err
		}
		stops = append(stops, func() { _ = s.Close() })
		m.devStore = s
		c.Mongo.URI = s.URI
		log.Info("embedded store started (FerretDB on SQLite)", "mongodb_uri", c.Mongo.URI, "dir", dir)
	}
	if dev {
		// Reachable from this machine only: the console opens without a
		// token to choose, and the printed link carries it.
		if c.HTTP.AdminToken, err = keptAdminToken(c.Embedded.DataDir); err != nil {
			return err
		}
		m.devToken = true
	}
	return nil
}

func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

// warnOnly keeps FerretDB's errors only: it logs every connection at info
// and commands it does not implement (endSessions) at warn.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelError && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }
func (h warnOnly) WithGroup(g string) slog.Handler       { return warnOnly{h.Handler.WithGroup(g)} }

// keptInstanceID returns the instance id kept in dir, made and written
// there on first use.
func keptInstanceID(dir string) (string, error) {
	return kept(dir, "instance-id", "instance id", 0o644, func() string {
		host, _ := os.Hostname()
		return fmt.Sprintf("%s-%s", host, uuid.NewString()[:8])
	})
}

// free checks that addr, a fixed port of an embedded server, can be bound:
// the servers themselves report a port in use only after their start-up
// times out (NATS after 30 s, blaming readiness).
func free(addr string, port int, env, flag string) error {
	if port <= 0 {
		return nil // chosen by the system
	}
	ln, err := listen(addr, env, flag)
	if err != nil {
		return err
	}
	return ln.Close()
}
