package storetest

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/mongodb"
)

// HoldingProxy forwards TCP connections to a store and, once Hold is
// called, holds every byte its clients send (the store answers nothing
// meanwhile, as over a stalled link) until Release sends them on, in
// order. It is the real fault behind the late-write tests: a request that
// leaves the client, stalls, and lands after others.
type HoldingProxy struct {
	Addr string // host:port the clients dial

	ln   net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	held bool
	done bool   // closed
	seen []byte // what clients sent while held
	conn []net.Conn
}

// NewHoldingProxy forwards to target until the test ends.
func NewHoldingProxy(t testing.TB, target string) *HoldingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &HoldingProxy{Addr: ln.Addr().String(), ln: ln}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(p.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conn = append(p.conn, c, up)
			p.mu.Unlock()
			go p.forward(c, up)
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return p
}

// forward copies what the client sends, waiting while the proxy holds.
func (p *HoldingProxy) forward(c, up net.Conn) {
	defer up.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.held {
				p.seen = append(p.seen, buf[:n]...)
				p.cond.Broadcast()
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

// Hold stops forwarding what clients send from now on.
func (p *HoldingProxy) Hold() {
	p.mu.Lock()
	p.held, p.seen = true, nil
	p.mu.Unlock()
}

// WaitHeld blocks until the bytes held since Hold contain sub (such as a
// command's name as a BSON key, "\x02update\x00"), failing the test if
// they do not within limit.
func (p *HoldingProxy) WaitHeld(t testing.TB, sub []byte, limit time.Duration) {
	t.Helper()
	timer := time.AfterFunc(limit, func() {
		p.mu.Lock()
		p.done = true
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for !bytes.Contains(p.seen, sub) && !p.done {
		p.cond.Wait()
	}
	if !bytes.Contains(p.seen, sub) {
		t.Fatalf("the proxy held no %q within %s", sub, limit)
	}
}

// Release sends on everything held and forwards freely again.
func (p *HoldingProxy) Release() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes the proxy: it accepts nothing more and drops every
// connection it forwards, as a failed network does.
func (p *HoldingProxy) Cut() { p.close() }

func (p *HoldingProxy) close() {
	p.mu.Lock()
	p.held, p.done = false, true
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conn {
		_ = c.Close()
	}
}

// HeldClient returns a client of the test's store (MongoURI) whose
// connections pass through a HoldingProxy, and the proxy; the client is
// disconnected when the test ends.
func HeldClient(t testing.TB) (*mongo.Client, *HoldingProxy) {
	t.Helper()
	u, err := url.Parse(MongoURI(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := NewHoldingProxy(t, u.Host)
	u.Host = proxy.Addr
	c, err := mongo.Connect(mongodb.ClientOptions(u.String()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c, proxy
}
