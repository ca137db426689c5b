package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/outbox"
)

// relayBenchCommits is how many one-event commits BenchmarkRelayPublish
// publishes.
const relayBenchCommits = 5000

// BenchmarkRelayPublish measures how fast the relay publishes the log from
// its change stream, against the raw async publish rate of the same
// JetStream connection measured in the same run:
//
//  1. relay: a relay run on the empty log leaves its checkpoint at the
//     log's end; relayBenchCommits commits are appended with no relay
//     running (not timed), then a relay is started; events/s from its
//     start until it has had every event acknowledged
//     (orderd_relay_published_events_total): it reads back the positions
//     of what the stream holds since its checkpoint, resumes its change
//     stream from the checkpoint, publishes, and saves its checkpoints.
//  2. raw: relayBenchCommits messages of the same bodies (an OrderPlaced
//     event each, as the relay sends it), each with a fresh Nats-Msg-Id,
//     sent with PublishMsgAsync and waited for with PublishAsyncComplete;
//     events/s. It runs second: run first, its messages were in the
//     stream since the relay's checkpoint, and the relay's start spent
//     about 20 ms reading their headers back.
//
// Figures: raw_events/s, relay_events/s and relay_to_raw (their ratio).
func BenchmarkRelayPublish(b *testing.B) {
	ctx := b.Context()
	s, db, n, cfg := openOutbox(b)
	ocfg := outbox.Config{Owner: "bench"}
	first := newRelay(b, db, bus.NewPublisher(n.JS, cfg), ocfg)
	fctx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		_ = first.Run(fctx)
	}()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if cp, err := first.lease.Checkpoint(ctx); err == nil && cp.Token != nil {
			break
		}
		if time.Since(start) > time.Minute {
			b.Fatal("no relay checkpoint within a minute")
		}
	}
	stopFirst()
	<-firstDone
	relay := newRelay(b, db, bus.NewPublisher(n.JS, cfg), ocfg)
	var events []domain.Event
	for i := range relayBenchCommits {
		c := storetest.NewCommit(fmt.Sprintf("bench-%06d", i), 0, domain.OrderPlaced{CustomerID: "cust-bench", Currency: "BRL",
			Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1990}}})
		if _, err := s.Append(ctx, c); err != nil {
			b.Fatalf("append: %v", err)
		}
		events = append(events, c.Events...)
	}

	// One run whatever b.N: make bench runs it with -benchtime 1x.
	b.ResetTimer()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		_ = relay.Run(rctx)
	}()
	for metric(b, relay.reg, "orderd_relay_published_events_total") < relayBenchCommits {
		if time.Since(start) > time.Minute {
			b.Fatalf("the relay published %v of %d events within a minute",
				metric(b, relay.reg, "orderd_relay_published_events_total"), relayBenchCommits)
		}
		time.Sleep(2 * time.Millisecond)
	}
	took := time.Since(start)
	cancel()
	<-done

	start = time.Now()
	for _, e := range events {
		body, err := domain.MarshalEvent(e)
		if err != nil {
			b.Fatal(err)
		}
		msg := &nats.Msg{Subject: cfg.Subject("raw-" + e.StreamID), Data: body, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, uuid.NewString())
		if _, err := n.JS.PublishMsgAsync(msg, jetstream.WithStallWait(10*time.Second)); err != nil {
			b.Fatalf("raw publish: %v", err)
		}
	}
	select {
	case <-n.JS.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("raw publishes not acknowledged within a minute")
	}
	raw := time.Since(start)

	rawRate := relayBenchCommits / raw.Seconds()
	relayRate := relayBenchCommits / took.Seconds()
	b.ReportMetric(rawRate, "raw_events/s")
	b.ReportMetric(relayRate, "relay_events/s")
	b.ReportMetric(relayRate/rawRate, "relay_to_raw")
	b.Logf("raw async publish %d events in %v (%.0f/s); relay %d events in %v (%.0f/s); relay/raw %.2f",
		relayBenchCommits, raw.Round(time.Millisecond), rawRate, relayBenchCommits, took.Round(time.Millisecond), relayRate, relayRate/rawRate)
}
