package projectortest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projector"
)

// Bus is an embedded NATS server with the event stream.
type Bus struct {
	*storetest.NATS
	Stream bus.StreamConfig
}

// Start is the set-up a projector test begins with: its context (see
// projectiontest.Context), a NATS server with a JetStream event stream of
// four partitions (storetest.StartNATS and NewStream), stopped when the
// test ends, and a fresh
// database with the event store on it and its indexes
// (storetest.OpenStore); a relayed test runs the relay on that store.
func Start(t *testing.T, limit time.Duration) (context.Context, *Bus, *mongo.Database, *mongodb.EventStore) {
	t.Helper()
	n := storetest.StartNATS(t)
	b := &Bus{NATS: n, Stream: storetest.NewStream(t, n, 4)}
	es, db := storetest.OpenStore(t)
	return projectiontest.Context(t, limit), b, db, es
}

// RunnerConfig is a projector.RunnerConfig consuming b's stream with
// test batch sizes.
func (b *Bus) RunnerConfig() projector.RunnerConfig {
	return projector.RunnerConfig{Stream: b.Stream.Name, SubjectPrefix: b.Stream.SubjectPrefix, Partitions: b.Stream.Partitions, BatchSize: 16,
		PinnedTTL: 4 * time.Second}
}

// Messages is the number of messages the stream holds.
func (b *Bus) Messages(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	st, err := b.JS.Stream(ctx, b.Stream.Name) // its info read with it
	if err != nil {
		t.Fatalf("stream %s: %v", b.Stream.Name, err)
	}
	return st.CachedInfo().State.Msgs
}

// Publish puts body on the event subject of stream id with the given
// Nats-Msg-Id and returns the ack.
func (b *Bus) Publish(t *testing.T, ctx context.Context, streamID string, body []byte, msgID string) *jetstream.PubAck {
	t.Helper()
	msg := &nats.Msg{Subject: b.Stream.Subject(streamID), Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	ack, err := b.JS.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("publish to %s: %v", msg.Subject, err)
	}
	return ack
}

// PublishEvents publishes events in the order given, each with prefix
// plus its id as its Nats-Msg-Id (the relay's is the id alone: prefix ""),
// and fails if the stream dropped one as a duplicate.
func (b *Bus) PublishEvents(t *testing.T, ctx context.Context, events []domain.Event, prefix string) {
	t.Helper()
	for _, e := range events {
		body, err := domain.MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		if ack := b.Publish(t, ctx, e.StreamID, body, prefix+e.ID); ack.Duplicate {
			t.Fatalf("publish %s v%d as %q: the stream dropped it as a duplicate", e.StreamID, e.Version, prefix+e.ID)
		}
	}
}

// Run starts a Runner of p on b's stream with cfg, its dead letters in
// db, and stops it when the test ends.
func Run(t *testing.T, b *Bus, db *mongo.Database, p projector.Projection, cfg projector.RunnerConfig, m *projector.Metrics) *projector.Runner {
	t.Helper()
	r := projector.NewRunner(p, b.JS, mongodb.NewDeadLetters(db), cfg, projectiontest.Logger(t), m)
	projectiontest.Go(t, r.Name()+" runner", r.Run)
	return r
}

// WaitLag waits until every runner's consumer has no message pending or
// unacknowledged.
func WaitLag(t *testing.T, ctx context.Context, limit time.Duration, runners ...*projector.Runner) {
	t.Helper()
	projectiontest.WaitFor(t, limit, "consumer lag 0", func() error {
		for _, r := range runners {
			n, err := r.Lag(ctx)
			if err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("%s: lag %d", r.Name(), n)
			}
		}
		return nil
	})
}
