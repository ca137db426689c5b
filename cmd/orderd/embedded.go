//go:build !noembed

package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"

	"github.com/orderd/orderd/internal/devstore"
)

// startEmbedded starts the embedded servers that the config leaves
// unnamed, with their data under DataDir, and fills in their URLs; NATS
// only when a role needs it. The returned func stops them.
func startEmbedded(c *Config, log *slog.Logger) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if r, _ := c.roles(); c.NATSURL == "" && r.needsBus() {
		host, port, err := splitAddr(c.EmbeddedNATSAddr)
		if err != nil {
			return stop, err
		}
		dir := filepath.Join(c.DataDir, "nats")
		ns, err := devstore.StartNATS(dir, host, port)
		if err != nil {
			return stop, err
		}
		stops = append(stops, ns.Shutdown)
		c.NATSURL = ns.ClientURL()
		log.Info("embedded NATS started", "url", c.NATSURL, "dir", dir)
	}
	if c.MongoURI == "" {
		dir := filepath.Join(c.DataDir, "store")
		s, err := devstore.StartStore(dir, c.EmbeddedStoreAddr, slog.New(warnOnly{log.With("component", "ferretdb").Handler()}))
		if err != nil {
			stop()
			return func() {}, err
		}
		stops = append(stops, func() { _ = s.Close() })
		c.MongoURI = s.URI
		log.Info("embedded store started (FerretDB on SQLite)", "mongodb_uri", c.MongoURI, "dir", dir)
	}
	return stop, nil
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
