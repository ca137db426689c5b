package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig names the JetStream stream the relay publishes to. Each
// event goes to subject SubjectPrefix + "." + stream id.
type StreamConfig struct {
	Name          string        // JetStream stream name, e.g. "ORDERS"
	SubjectPrefix string        // e.g. "orders.events"
	Replicas      int           // 1 for a single server, 3 for a cluster
	Duplicates    time.Duration // de-duplication window for Nats-Msg-Id
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
// file storage, no age limit, one subject per order stream, server-side
// de-duplication, and with Partitions the subject transform <prefix>.* ->
// <prefix>.{{partition(n,1)}}.{{wildcard(1)}}. A transform applies to the
// messages stored after it is set: those stored before keep their subject.
//
// A cluster still forming or electing (no meta leader, too few peers to
// place the replicas, no answer yet) is waited out, with backoff, until
// ctx is done: processes started beside a cluster's nodes would otherwise
// exit and wait for their restart. Errors: the server's refusal of the
// configuration at once, else the last error when ctx is done.
func EnsureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(0)), ctx)
	var last error
	err := backoff.Retry(func() error {
		// Each attempt bounded: a request that no meta leader takes is
		// never answered.
		actx, cancel := context.WithTimeout(ctx, ensureAttempt)
		defer cancel()
		err := ensureStream(actx, js, c)
		if err != nil && !forming(err) {
			return backoff.Permanent(err)
		}
		if err != nil {
			last = err
		}
		return err
	}, b)
	if err != nil && ctx.Err() != nil && last != nil {
		return last
	}
	return err
}

// ensureAttempt bounds one attempt of EnsureStream.
const ensureAttempt = 5 * time.Second

// forming reports whether err is what a cluster answers while it forms or
// elects: no responders or no answer in time, JetStream not available,
// no peers to place the replicas on, no leader yet, no resources yet.
func forming(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10005, 10006, 10008, 10009, 10023: // JSClusterNoPeers, NotActive, NotAvail ("temporarily unavailable"), NotLeader, InsufficientResources
			return true
		}
		return apiErr.Code == 503
	}
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded)
}

func ensureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	sc := jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{c.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   max(c.Replicas, 1),
		Duplicates: c.Duplicates,
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
