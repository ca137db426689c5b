package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// devMode reports whether c is the development mode that makes its own
// admin token: both servers embedded (no MONGODB_URI, no NATS_URL), the
// HTTP server on loopback only, and no ADMIN_TOKEN. Anything reachable
// from elsewhere keeps the admin routes off without ADMIN_TOKEN.
func devMode(c *Config) bool {
	if c.Mongo.URI != "" || c.NATS.URL != "" || c.HTTP.AdminToken != "" {
		return false
	}
	host, _, err := net.SplitHostPort(c.HTTPAddr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// keptAdminToken returns the admin token kept in dir/admin-token, made on
// first use: 32 random hex characters, in a file only its owner reads,
// so that the console's link and an exported ADMIN_TOKEN outlive a
// restart.
func keptAdminToken(dir string) (string, error) {
	return kept(dir, "admin-token", "admin token", 0o600, func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		return hex.EncodeToString(b)
	})
}

// kept returns the value kept in the file dir/name, or, when there is
// none, one made by newValue and written there with perm; what names the
// value in errors.
func kept(dir, name, what string, perm os.FileMode, newValue func() string) (string, error) {
	path := filepath.Join(dir, name)
	if b, err := os.ReadFile(path); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	v := newValue()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if err := os.WriteFile(path, []byte(v+"\n"), perm); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}
