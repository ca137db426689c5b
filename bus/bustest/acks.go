package bustest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// AckDropper forwards NATS client connections to a server and, while
// Dropping, drops what its clients publish to JetStream acknowledgement
// subjects ("$JS.ACK.>"): the fault of a consumer whose leader is lost or
// elected, which loses the acknowledgements sent to it meanwhile while the
// client sees nothing wrong. Everything else passes unchanged, both ways.
// Cut closes the connections it forwards, as a lost link does; the
// clients reconnect through it.
type AckDropper struct {
	URL string // nats://host:port the clients connect to

	dropping atomic.Bool
	dropped  atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

// NewAckDropper forwards to the server at addr (host:port) until the test
// ends.
func NewAckDropper(t testing.TB, addr string) *AckDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &AckDropper{URL: "nats://" + ln.Addr().String()}
	t.Cleanup(func() {
		_ = ln.Close()
		d.Cut()
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
			d.mu.Lock()
			d.conns = append(d.conns, c, up)
			d.mu.Unlock()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
			go func() { d.forward(c, up); _ = up.Close() }()
		}
	}()
	return d
}

// Drop starts (true) or stops (false) dropping acknowledgements.
func (d *AckDropper) Drop(on bool) { d.dropping.Store(on) }

// Cut closes every connection forwarded so far.
func (d *AckDropper) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}

// Dropped is how many acknowledgements were dropped so far.
func (d *AckDropper) Dropped() int64 { return d.dropped.Load() }

var ackSubject = []byte("$JS.ACK.")

// forward copies the client's protocol to up operation by operation
// (https://docs.nats.io/reference/reference-protocols/nats-protocol):
// PUB and HPUB carry a payload whose size ends their line; the other
// operations are one line each.
func (d *AckDropper) forward(c, up net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		msg := line
		if bytes.HasPrefix(line, []byte("PUB ")) || bytes.HasPrefix(line, []byte("HPUB ")) {
			f := bytes.Fields(line)
			n, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil {
				return
			}
			payload := make([]byte, n+2) // and its \r\n
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			if d.dropping.Load() && bytes.HasPrefix(f[1], ackSubject) {
				d.dropped.Add(1)
				continue
			}
			msg = append(line, payload...)
		}
		if _, err := up.Write(msg); err != nil {
			return
		}
	}
}
