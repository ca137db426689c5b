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
	if c.Mongo.URI != "" || c.NATS.URL != "" || c.HTTP.AdminToken != "" || c.noDevToken {
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
	path := filepath.Join(dir, "admin-token")
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("admin token: %w", err)
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	t := hex.EncodeToString(b)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	return t, nil
}
