package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/outbox"
)

// relayBenchCommits is how many one-event commits BenchmarkRelayPublish
// publishes.
const relayBenchCommits = 5000

// BenchmarkRelayPublish measures how fast one API instance's Relay
// publishes its own appends, against the raw async publish rate of the
// same JetStream connection measured in the same run:
//
//  1. raw: relayBenchCommits messages of the same bodies (an OrderPlaced
//     event each, as the relay sends it), each with a fresh Nats-Msg-Id,
//     sent with PublishMsgAsync and waited for with PublishAsyncComplete;
//     events/s.
//  2. relay: relayBenchCommits commits appended with the Relay not running
//     (its queue holds them all; the appends are not timed), then the
//     Relay started; events/s from its start until it has had every event
//     acknowledged (orderd_relay_published_events_total). Its published
//     markers are written by their own loop and are not waited for.
//
// Figures: raw_events/s, relay_events/s and relay_to_raw (their ratio).
func BenchmarkRelayPublish(b *testing.B) {
	ctx := b.Context()
	_, db, n, cfg := openOutbox(b)
	in := newInstance(b, db, n.JS, cfg, outbox.Config{Owner: "bench", QueueSize: relayBenchCommits})
	var events []domain.Event
	for i := range relayBenchCommits {
		c := storetest.NewCommit(fmt.Sprintf("bench-%06d", i), 0, domain.OrderPlaced{CustomerID: "cust-bench", Currency: "BRL",
			Items: []domain.Line{{SKU: "sku-1", Quantity: 2, UnitPriceCents: 1990}}})
		if _, err := in.store.Append(ctx, c); err != nil {
			b.Fatalf("append: %v", err)
		}
		events = append(events, c.Events...)
	}

	// One run whatever b.N: make bench runs it with -benchtime 1x.
	b.ResetTimer()
	start := time.Now()
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

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start = time.Now()
	go func() {
		defer close(done)
		_ = in.relay.Run(rctx)
	}()
	for metric(b, in.relayReg, "orderd_relay_published_events_total") < relayBenchCommits {
		if time.Since(start) > time.Minute {
			b.Fatalf("the relay published %v of %d events within a minute",
				metric(b, in.relayReg, "orderd_relay_published_events_total"), relayBenchCommits)
		}
		time.Sleep(2 * time.Millisecond)
	}
	relay := time.Since(start)
	cancel()
	<-done

	rawRate := relayBenchCommits / raw.Seconds()
	relayRate := relayBenchCommits / relay.Seconds()
	b.ReportMetric(rawRate, "raw_events/s")
	b.ReportMetric(relayRate, "relay_events/s")
	b.ReportMetric(relayRate/rawRate, "relay_to_raw")
	b.Logf("raw async publish %d events in %v (%.0f/s); relay %d events in %v (%.0f/s); relay/raw %.2f",
		relayBenchCommits, raw.Round(time.Millisecond), rawRate, relayBenchCommits, relay.Round(time.Millisecond), relayRate, relayRate/rawRate)
}
