// Package tcpproxy gives tests the network between a client and a server
// as a TCP proxy on loopback that they can fail on purpose: stall what
// clients send (Hold, Release), drop every connection (Cut), or go down
// and come back on the same address (Close, Open).
package tcpproxy

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a server, both ways and in order. It
// is the real fault behind the tests of late writes and lost links: a
// request that leaves the client, stalls and lands after others; a link
// whose clients reconnect; a node cut off from its peers.
type Proxy struct {
	Addr string // host:port the clients dial

	target string
	mu     sync.Mutex
	cond   *sync.Cond
	ln     net.Listener // nil while closed
	conns  []net.Conn
	held   bool
	seen   []byte // what clients sent while held
}

// New listens on addr (port 0 for any free one; a fixed one to Open
// again after Close) and forwards to target (host:port) until the test
// ends.
func New(t testing.TB, addr, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.cond = sync.NewCond(&p.mu)
	go p.accept(ln)
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // closed meanwhile
			p.mu.Unlock()
			_, _ = c.Close(), up.Close()
			return
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.forward(c, up)
		go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
	}
}

// forward copies what the client sends, waiting while the proxy holds.
func (p *Proxy) forward(c, up net.Conn) {
	defer up.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.held {
				p.seen = append(p.seen, buf[:n]...)
			}
			for p.held {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Hold stops forwarding what clients send from now on (the server
// answers nothing meanwhile, as over a stalled link).
func (p *Proxy) Hold() {
	p.mu.Lock()
	p.held, p.seen = true, nil
	p.mu.Unlock()
}

// WaitHeld blocks until the bytes held since Hold contain sub (such as a
// command's name as a BSON key, "\x02update\x00"), failing the test if
// they do not within limit.
func (p *Proxy) WaitHeld(t testing.TB, sub []byte, limit time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(limit); !p.holds(sub); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the proxy held no %q within %s", sub, limit)
		}
	}
}

// holds reports whether the bytes held since Hold contain sub.
func (p *Proxy) holds(sub []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.seen, sub)
}

// Release sends on everything held, in order, and forwards freely again.
func (p *Proxy) Release() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every connection forwarded so far, as a lost link does; the
// proxy goes on accepting, so clients reconnect through it.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Close releases what is held, stops accepting and cuts every
// connection, as a failed network does, until Open.
func (p *Proxy) Close() {
	p.Release()
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Cut()
}

// Open listens on Addr again after Close; it does nothing while the
// proxy listens.
func (p *Proxy) Open() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return nil
	}
	var ln net.Listener
	var err error
	// The port was just given up by Close: it may take a moment to free.
	for range 100 {
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.ln = ln
	go p.accept(ln)
	return nil
}
