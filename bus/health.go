package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/domain"
)

// CheckStream asks for the info of the stream the publisher sends to,
// which the stream's leader answers (in a cluster also while the meta
// leader is being elected, unlike account info, which only the meta
// leader answers): it is what the relay publishes to and the projectors
// consume from. It returns nil when the stream answers with a quorum of
// its replicas; an error wrapping domain.ErrUnavailable when the cluster
// answers that it has no leader yet (an election, which passes within
// seconds), when nothing answers in time (the stream has no leader, or
// this connection is down) or when its leader has no quorum (the answers
// EnsureStream waits out as a cluster forming, and those of a connection
// down); and the request's error otherwise (no such stream).
func (p *Publisher) CheckStream(ctx context.Context) error {
	name := p.stream.Name
	st, err := p.js.Stream(ctx, name)
	switch {
	case err == nil:
		return quorum(name, st.CachedInfo())
	case forming(err) || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected):
		return fmt.Errorf("stream %s: %w: %w", name, domain.ErrUnavailable, err)
	}
	return fmt.Errorf("stream %s: %w", name, err)
}

// quorum returns nil when the leader of stream name sees a majority of
// its replicas (itself included) current and online, so that what is
// published to it can be stored; otherwise an error wrapping
// domain.ErrUnavailable. A leader left alone answers for its stream's
// info, but acknowledges nothing.
func quorum(name string, info *jetstream.StreamInfo) error {
	if info == nil || info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
		return nil
	}
	live := 1
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			live++
		}
	}
	// The stream's configured size, not the replicas listed: while the
	// cluster replaces a lost peer the leader lists it beside its
	// successor (a stream at R3 was seen with four replicas, two current,
	// and called without quorum).
	size := len(info.Cluster.Replicas) + 1
	if r := info.Config.Replicas; r > 0 {
		size = r
	}
	if 2*min(live, size) <= size {
		return fmt.Errorf("stream %s: %w: %d of %d replicas current, no quorum", name, domain.ErrUnavailable, live, size)
	}
	return nil
}
