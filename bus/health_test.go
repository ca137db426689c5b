package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/bus/bustest"
	"github.com/orderd/orderd/domain"
)

// CheckStream tells the bus's outages (no leader answers: every
// instance's) from this publisher's or consumer's own trouble: on a
// three-node cluster, the stream answers; a stream that does not exist is
// not an outage; with two of three nodes down the stream has no quorum,
// and the answer (none in time, "electing", or a leader left alone that
// sees no quorum of current replicas) is an outage.
func TestCheckStreamTellsOutagesFromOwnTrouble(t *testing.T) {
	cl := bustest.StartCluster(t, 3)
	nc, err := nats.Connect(cl.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bus.StreamConfig{Name: "CHECKED", SubjectPrefix: "checked", Duplicates: time.Minute, Replicas: 3}
	deadline := time.Now().Add(60 * time.Second)
	for err := bus.EnsureStream(t.Context(), js, cfg); err != nil; err = bus.EnsureStream(t.Context(), js, cfg) {
		if time.Now().After(deadline) {
			t.Fatalf("ensure stream: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader := cl.WaitStreamLeader(cfg.Name, 30*time.Second)
	check := func(name string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		return bus.CheckStream(ctx, js, name)
	}
	if err := check(cfg.Name); err != nil {
		t.Fatalf("stream with a leader: %v", err)
	}
	if err := check("MISSING"); err == nil || errors.Is(err, domain.ErrUnavailable) || !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("missing stream: %v; want not found, not unavailable", err)
	}
	followers := []int{(leader + 1) % 3, (leader + 2) % 3}
	cl.Kill(followers[0])
	// The leader and one follower left: still led, once this client has
	// reconnected if it was on the killed node (slow on a busy machine).
	deadline = time.Now().Add(30 * time.Second)
	for err := check(cfg.Name); err != nil; err = check(cfg.Name) {
		if time.Now().After(deadline) {
			t.Fatalf("stream with two of three replicas: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cl.Kill(followers[1])
	deadline = time.Now().Add(60 * time.Second)
	for {
		err := check(cfg.Name)
		if errors.Is(err, domain.ErrUnavailable) {
			t.Logf("stream without quorum: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream without quorum: %v; want unavailable", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
