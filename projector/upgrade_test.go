package projector_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// TestRunnerPinsTheConsumersOfAnEarlierRelease: a partition consumer an
// earlier release created (no priority group, some messages acknowledged)
// is updated in place to a pinned one: it keeps its position, so what it
// had acknowledged is not delivered again.
func TestRunnerPinsTheConsumersOfAnEarlierRelease(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 60*time.Second)
	f := projectiontest.NewFixture(t, ctx, es, "old", 8, 2)
	b.PublishEvents(t, ctx, f.Flat, "")
	cfg := b.RunnerConfig()
	p := mongodb.NewProjection(db, projection.OrderSummaries, es, nil, mongodb.NewPointers(db))
	r := projector.NewRunner(p, b.JS, mongodb.NewDeadLetters(db), cfg, projectiontest.Logger(t), nil)
	acked := map[int]uint64{}
	for part := range cfg.Partitions {
		c, err := b.JS.CreateOrUpdateConsumer(ctx, b.Stream.Name, jetstream.ConsumerConfig{Durable: r.ConsumerName(part),
			FilterSubject: r.FilterSubject(part), AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1})
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := c.FetchNoWait(1)
		if err != nil {
			t.Fatal(err)
		}
		for m := range msgs.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
			md, _ := m.Metadata()
			acked[part] = md.Sequence.Stream
		}
	}
	for part := range cfg.Partitions {
		c, err := r.Consumer(ctx, part)
		if err != nil {
			t.Fatalf("partition %d: %v", part, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.PriorityPolicy != jetstream.PriorityPolicyPinned || info.AckFloor.Stream != acked[part] {
			t.Errorf("partition %d: priority policy %v, ack floor %d; want pinned, %d", part, info.Config.PriorityPolicy, info.AckFloor.Stream, acked[part])
		}
	}
}
