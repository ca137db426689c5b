package bustest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Link forwards NATS client connections to a server, both ways and
// unchanged, until Cut closes the connections it forwards, as a lost link
// does; the clients reconnect through it.
type Link struct {
	URL string // nats://host:port the clients connect to

	mu    sync.Mutex
	conns []net.Conn
}

// NewLink forwards to the server at addr (host:port) until the test ends.
func NewLink(t testing.TB, addr string) *Link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{URL: "nats://" + ln.Addr().String()}
	t.Cleanup(func() {
		_ = ln.Close()
		l.Cut()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, up)
			l.mu.Unlock()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		}
	}()
	return l
}

// Cut closes every connection forwarded so far.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}
