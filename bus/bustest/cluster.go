package bustest

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/internal/freeport"
	"github.com/orderd/orderd/internal/tcpproxy"
)

// Cluster is a NATS JetStream cluster of servers on loopback, run in the
// test process from the nats-server library the project pins, each
// storing under its own temp dir: the three-node cluster of the
// deployments, whose nodes a test can kill and start again on the same
// ports and store.
//
// Every route between two nodes passes through a TCP proxy of its own, so
// that Kill can cut a node off before it stops: a node that is shut down
// while its peers still hear it hands its raft leaderships over at once,
// where a crashed one leaves its peers to notice the silence and elect.
type Cluster struct {
	t       testing.TB
	opts    []*server.Options
	servers []*server.Server    // nil while a node is down
	links   [][]*tcpproxy.Proxy // links[i][j]: node i's route to node j
}

// StartCluster starts n servers forming one JetStream cluster and waits
// until it has a meta leader that can place a replica on every node; the
// servers are shut down when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := make([]int, 2*n)
	for i := range ports {
		ports[i] = freeport.Port(t)
	}
	c := &Cluster{t: t, servers: make([]*server.Server, n), links: make([][]*tcpproxy.Proxy, n)}
	for i := range n {
		c.links[i] = make([]*tcpproxy.Proxy, n)
		var routes []*url.URL
		for j := range n {
			if j == i {
				continue
			}
			l := tcpproxy.New(t, fmt.Sprintf("127.0.0.1:%d", freeport.Port(t)), fmt.Sprintf("127.0.0.1:%d", ports[n+j]))
			c.links[i][j] = l
			routes = append(routes, &url.URL{Scheme: "nats-route", Host: l.Addr})
		}
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "orderd-test", Host: "127.0.0.1", Port: ports[n+i]},
			Routes:     routes,
		})
	}
	t.Cleanup(func() { // runs before the links, registered earlier, close
		for i := range c.servers {
			c.Shutdown(i)
		}
	})
	for i := range n {
		c.Start(i)
	}
	// A meta leader elected before it has heard every node's stats
	// refuses a stream of n replicas: "no suitable peers for placement".
	c.wait(60*time.Second, "a JetStream meta leader with every node as a peer", func() int {
		if i := c.MetaLeader(); i >= 0 && len(c.servers[i].JetStreamClusterPeers()) == n {
			return i
		}
		return -1
	})
	return c
}

// Start starts node i, on its ports and store dir, with its routes
// joined again, and waits until it takes connections.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if c.servers[i] != nil {
		return
	}
	c.join(i)
	s, err := server.NewServer(c.opts[i].Clone())
	if err != nil {
		c.t.Fatalf("nats node %d: %v", i, err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		c.t.Fatalf("nats node %d: not ready within 30s", i)
	}
	c.servers[i] = s
}

// Shutdown stops node i in order (its store stays): the raft groups it
// leads hand their leadership over before it goes.
func (c *Cluster) Shutdown(i int) {
	if s := c.servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.servers[i] = nil
	}
}

// Kill stops node i as a crash does: its routes are cut first, so its
// peers hear nothing more from it, then it stops (its store stays). The
// groups it led elect a new leader once their election timeout passes.
func (c *Cluster) Kill(i int) {
	for j := range c.links {
		for _, l := range []*tcpproxy.Proxy{c.links[i][j], c.links[j][i]} {
			if l != nil {
				l.Close()
			}
		}
	}
	c.Shutdown(i)
}

// join opens node i's routes, cut by Kill.
func (c *Cluster) join(i int) {
	c.t.Helper()
	for j := range c.links {
		for _, l := range []*tcpproxy.Proxy{c.links[i][j], c.links[j][i]} {
			if l != nil {
				if err := l.Open(); err != nil {
					c.t.Fatalf("route of nats node %d: %v", i, err)
				}
			}
		}
	}
}

// URL is every node's client URL, comma-separated, for nats.Connect.
func (c *Cluster) URL() string {
	var urls []string
	for _, o := range c.opts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// Name is node i's server name.
func (c *Cluster) Name(i int) string { return c.opts[i].ServerName }

// MetaLeader is the node leading the JetStream meta group, -1 while none
// of the running ones does.
func (c *Cluster) MetaLeader() int { return c.first((*server.Server).JetStreamIsLeader) }

// StreamLeader is the node leading stream's group in the global account,
// -1 while none of the running ones does.
func (c *Cluster) StreamLeader(stream string) int {
	return c.first(func(s *server.Server) bool { return s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) })
}

// ConsumerLeader is the node leading the group of stream's consumer in
// the global account, -1 while none of the running ones does.
func (c *Cluster) ConsumerLeader(stream, consumer string) int {
	return c.first(func(s *server.Server) bool {
		return s.JetStreamIsConsumerLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream, consumer)
	})
}

// StreamCurrent reports whether every running node's replica of stream is
// current with its leader.
func (c *Cluster) StreamCurrent(stream string) bool {
	behind := c.nodes(func(s *server.Server) bool { return !s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) })
	return len(behind) == 0
}

// WaitMetaLeader waits until a running node leads the meta group and
// returns it.
func (c *Cluster) WaitMetaLeader(limit time.Duration) int {
	c.t.Helper()
	return c.wait(limit, "a JetStream meta leader", c.MetaLeader)
}

// WaitStreamLeader waits until a running node leads stream's group and
// returns it.
func (c *Cluster) WaitStreamLeader(stream string, limit time.Duration) int {
	c.t.Helper()
	return c.wait(limit, "a leader of stream "+stream, func() int { return c.StreamLeader(stream) })
}

func (c *Cluster) wait(limit time.Duration, what string, leader func() int) int {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if i := leader(); i >= 0 {
			return i
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitConsumerLeader waits until a running node leads the group of
// stream's consumer and returns it.
func (c *Cluster) WaitConsumerLeader(stream, consumer string, limit time.Duration) int {
	c.t.Helper()
	return c.wait(limit, "a leader of consumer "+consumer, func() int { return c.ConsumerLeader(stream, consumer) })
}

// StreamPeers are the running nodes holding a replica of stream.
func (c *Cluster) StreamPeers(stream string) []int {
	return c.nodes(func(s *server.Server) bool { return s.JetStreamIsStreamAssigned(server.DEFAULT_GLOBAL_ACCOUNT, stream) })
}

// nodes are the running nodes of which is holds, in order.
func (c *Cluster) nodes(is func(*server.Server) bool) []int {
	var out []int
	for i, s := range c.servers {
		if s != nil && is(s) {
			out = append(out, i)
		}
	}
	return out
}

// first is the first running node of which is holds, -1 when none.
func (c *Cluster) first(is func(*server.Server) bool) int {
	if n := c.nodes(is); len(n) > 0 {
		return n[0]
	}
	return -1
}

// ConnectTo opens a NATS connection to url (a cluster's: Cluster.URL, every
// node's, comma-separated) that reconnects without end, every 50 ms, to
// whichever node is up, then applies opts; it is closed when the test or
// benchmark ends. The connection is the JetStream context's Conn.
func ConnectTo(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
