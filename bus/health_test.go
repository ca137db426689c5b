package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	js := bustest.ConnectTo(t, cl.URL())
	cfg := bus.StreamConfig{Name: "CHECKED", SubjectPrefix: "checked", Duplicates: time.Minute, Replicas: 3}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := bus.EnsureStream(ctx, js, cfg); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	leader := cl.WaitStreamLeader(cfg.Name, 30*time.Second)
	check := func(name string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		return bus.NewPublisher(js, bus.StreamConfig{Name: name}).CheckStream(ctx)
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
	deadline := time.Now().Add(30 * time.Second)
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

// TestEnsureStreamWaitsForTheCluster: with two of three nodes down the
// cluster can place no R3 stream and has no meta leader; EnsureStream
// waits (a process started beside a cluster that is still forming) and
// creates the stream once the nodes are back. A configuration the server
// refuses is an error at once.
func TestEnsureStreamWaitsForTheCluster(t *testing.T) {
	cl := bustest.StartCluster(t, 3)
	cl.Shutdown(1)
	cl.Shutdown(2)
	js := bustest.ConnectTo(t, cl.URL())
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cfg := bus.StreamConfig{Name: "WAITS", SubjectPrefix: "waits", Duplicates: time.Minute, Replicas: 3}
	done := make(chan error, 1)
	go func() { done <- bus.EnsureStream(ctx, js, cfg) }()
	// Still waiting while the nodes are down: the first attempts have
	// been refused or gone unanswered.
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	if err := bus.EnsureStream(short, js, bus.StreamConfig{Name: "WAITS2", SubjectPrefix: "waits2", Replicas: 3}); err == nil {
		t.Fatal("an R3 stream created with two of three nodes down")
	}
	select {
	case err := <-done:
		t.Fatalf("EnsureStream returned %v with two of three nodes down; want it to wait", err)
	default:
	}
	cl.Start(1)
	cl.Start(2)
	if err := <-done; err != nil {
		t.Fatalf("ensure stream once the nodes are back: %v", err)
	}
	cl.WaitStreamLeader(cfg.Name, 30*time.Second)
	// A stream whose subjects overlap another's is refused at once.
	start := time.Now()
	err := bus.EnsureStream(ctx, js, bus.StreamConfig{Name: "OVERLAP", SubjectPrefix: "waits", Replicas: 3})
	if err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("a stream overlapping another's subjects: %v after %v; want refused at once", err, time.Since(start))
	}
}
