package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrElecting means JetStream answered that its cluster has no leader to
// serve the request yet: an election, which passes within seconds, not an
// outage.
var ErrElecting = errors.New("jetstream cluster electing a leader")

// clusterNotAvailable is the error code of nats-server's "JetStream system
// temporarily unavailable" (503), its answer while the meta group or the
// stream's group has no leader.
const clusterNotAvailable jetstream.ErrorCode = 10008

// CheckStream asks for the stream name's info, which the stream's leader
// answers (in a cluster also while the meta leader is being elected,
// unlike account info, which only the meta leader answers): it is what the
// relay publishes to and the projectors consume from. It returns nil when
// the stream answers, an error wrapping ErrElecting when the cluster
// answers that it has no leader yet, and the request's error otherwise:
// not connected, no answer in time (no stream leader, or a connection that
// is gone), no such stream.
func CheckStream(ctx context.Context, js jetstream.JetStream, name string) error {
	_, err := js.Stream(ctx, name)
	if err == nil {
		return nil
	}
	if electing(err) {
		return fmt.Errorf("stream %s: %w: %w", name, ErrElecting, err)
	}
	return fmt.Errorf("stream %s: %w", name, err)
}

// electing reports whether err is JetStream's answer that its cluster has
// no leader for the request yet.
func electing(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == clusterNotAvailable || apiErr.Code == 503)
}
