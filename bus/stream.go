package bus

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig names the JetStream stream the relay publishes to. Each
// event goes to subject SubjectPrefix + "." + stream id.
type StreamConfig struct {
	Name          string        // JetStream stream name, e.g. "ORDERS"
	SubjectPrefix string        // e.g. "orders.events"
	Replicas      int           // 1 for a single server, 3 for a cluster
	Duplicates    time.Duration // de-duplication window for Nats-Msg-Id
	MaxAge        time.Duration // how long messages are kept; 0 keeps them
	// Partitions, when above 0, makes the stream store each event under
	// <prefix>.<partition>.<stream id>, the partition a hash of the stream
	// id modulo Partitions (JetStream's deterministic subject-token
	// partitioning, partition(n,1)), so consumers can each take one
	// partition and keep a stream's events in order.
	Partitions int
}

// Subject returns the subject of a stream's events.
func (c StreamConfig) Subject(streamID string) string { return c.SubjectPrefix + "." + streamID }

// EnsureStream creates the JetStream stream or updates its configuration:
// file storage, one subject per order stream, server-side de-duplication,
// and with Partitions the subject transform <prefix>.* ->
// <prefix>.{{partition(n,1)}}.{{wildcard(1)}}. A transform applies to the
// messages stored after it is set: those stored before keep their subject.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	sc := jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{c.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   max(c.Replicas, 1),
		Duplicates: c.Duplicates,
		MaxAge:     c.MaxAge,
	}
	if c.Partitions > 0 {
		sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: c.SubjectPrefix + ".*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", c.SubjectPrefix, c.Partitions)}
	}
	// A stream already as wanted is left alone: every process ensures the
	// stream at start, and nats-server 2.15.2 updating a stream's
	// configuration races with creating a consumer of it (the race
	// detector reported fileStore.UpdateConfig against ConsumerStore when
	// projector processes started side by side).
	if st, err := js.Stream(ctx, c.Name); err == nil && sameStream(st.CachedInfo().Config, sc) {
		return nil
	}
	_, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	return nil
}

// sameStream reports whether have already holds every setting of want
// that EnsureStream sets.
func sameStream(have, want jetstream.StreamConfig) bool {
	sameTransform := (have.SubjectTransform == nil) == (want.SubjectTransform == nil) &&
		(want.SubjectTransform == nil || *have.SubjectTransform == *want.SubjectTransform)
	return slices.Equal(have.Subjects, want.Subjects) && have.Storage == want.Storage && have.Retention == want.Retention &&
		have.Replicas == want.Replicas && have.Duplicates == want.Duplicates && have.MaxAge == want.MaxAge && sameTransform
}
