package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderd/orderd/domain"
)

// shutdownGrace is how long a publish still waits for acks once its ctx is
// done: long enough for acks already on the wire, short enough not to hold
// up a shutdown when NATS is down.
const shutdownGrace = 2 * time.Second

// Publisher sends events to one JetStream stream as async publishes and
// waits for their acks. It is safe for concurrent use.
type Publisher struct {
	js     jetstream.JetStream
	stream StreamConfig
}

// NewPublisher returns a Publisher to stream through js. How many
// publishes may await their acks is js's WithPublishAsyncMaxPending.
func NewPublisher(js jetstream.JetStream, stream StreamConfig) *Publisher {
	return &Publisher{js: js, stream: stream}
}

// Connected reports whether the NATS connection can publish now.
func (p *Publisher) Connected() bool {
	nc := p.js.Conn()
	return nc != nil && nc.IsConnected()
}

// Send sends every event of commits, in order, as it is (its wire form,
// domain.MarshalEvent's JSON) on the subject of its commit's stream, with
// Nats-Msg-Id = its id and its log position in the positionHeader
// (positions[i] is that of commit i's first event; nil positions: none),
// and returns at once the wait for their acks. The wait returns the
// indexes in commits of the commits whose every event JetStream
// acknowledged, in order, also alongside an error (a send or an ack
// failed, or the time ran out): a commit is published only whole; and
// the stream sequence of the last event acknowledged. The time given runs
// from the call for both. A full window of publishes awaiting acks makes
// a send wait. Sends of one Publisher called one after the other reach
// the stream in that order, so a caller can send a round while the acks
// of the one before are still coming. A canceled ctx still sends (the
// final round of a shutdown) but waits at most shutdownGrace for acks.
func (p *Publisher) Send(ctx context.Context, commits []domain.RecordedCommit, positions []uint64, within time.Duration) func() ([]int, uint64, error) {
	if ctx.Err() != nil {
		within = min(within, shutdownGrace)
	}
	deadline := time.Now().Add(within)
	var (
		futures [][]jetstream.PubAckFuture
		sendErr error
	)
send:
	for i, c := range commits {
		fs := make([]jetstream.PubAckFuture, 0, len(c.Events))
		for k, e := range c.Events {
			var pos uint64
			if positions != nil {
				pos = positions[i] + uint64(k)
			}
			f, err := p.publishAsync(c.StreamID, e, pos, time.Until(deadline))
			if err != nil {
				sendErr = err
				break send // a commit is published only whole
			}
			fs = append(fs, f)
		}
		futures = append(futures, fs)
	}
	return func() ([]int, uint64, error) {
		// A commit counts only when every one of its events is
		// acknowledged. The wait ends at the deadline for all of them, or
		// shutdownGrace after ctx is done.
		wait, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		defer cancel()
		stop := context.AfterFunc(ctx, func() { time.AfterFunc(shutdownGrace, cancel) })
		defer stop()
		var (
			acked  []int
			seq    uint64
			ackErr error // the first; the others are usually the same
		)
		for i, fs := range futures {
			var err error
			for _, f := range fs {
				var ack *jetstream.PubAck
				if ack, err = ackOf(wait, ctx, f, within); err != nil {
					break
				}
				seq = max(seq, ack.Sequence)
			}
			if err == nil {
				acked = append(acked, i)
			} else if ackErr == nil {
				ackErr = err
			}
		}
		if err := errors.Join(sendErr, ackErr); err != nil {
			return acked, seq, fmt.Errorf("publish %d commits (%d acknowledged): %w", len(commits), len(acked), err)
		}
		return acked, seq, nil
	}
}

// Republish publishes events again (a replay of part of the log, for a new
// consumer or after the broker lost messages), each with its event id as
// Nats-Msg-Id, through Send, and waits for every ack, within
// republishWithin, or until ctx's deadline when sooner. Copies of events
// the stream still remembers within its de-duplication window are dropped
// by the server; consumers' version guards skip the rest. It returns the
// number of events acknowledged.
func (p *Publisher) Republish(ctx context.Context, events []domain.Event) (int, error) {
	commits := make([]domain.RecordedCommit, len(events))
	for i, e := range events {
		body, err := domain.MarshalEvent(e)
		if err != nil {
			return 0, fmt.Errorf("republish %s v%d: %w", e.StreamID, e.Version, err)
		}
		commits[i] = domain.RecordedCommit{StreamID: e.StreamID, Events: []domain.EventMessage{{ID: e.ID, Body: body}}}
	}
	within := republishWithin
	if d, ok := ctx.Deadline(); ok {
		within = min(within, time.Until(d))
	}
	acked, _, err := p.Send(ctx, commits, nil, within)()
	if err != nil {
		return len(acked), fmt.Errorf("republish: %w", err)
	}
	return len(acked), nil
}

// republishWithin bounds how long Republish waits for the sends and acks
// of one call.
const republishWithin = 30 * time.Second

// publishAsync sends event e of stream and returns the ack's future: its
// wire form on the stream's subject, with Nats-Msg-Id set to the event id,
// and its log position when it has one. When the JetStream context
// already awaits its maximum of acks it waits up to stall for room.
func (p *Publisher) publishAsync(stream string, e domain.EventMessage, position uint64, stall time.Duration) (jetstream.PubAckFuture, error) {
	if stall <= 0 {
		return nil, fmt.Errorf("publish event %s: the round's deadline has passed", e.ID)
	}
	msg := &nats.Msg{Subject: p.stream.Subject(stream), Data: e.Body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, e.ID)
	if position > 0 {
		msg.Header.Set(positionHeader, strconv.FormatUint(position, 10))
	}
	f, err := p.js.PublishMsgAsync(msg, jetstream.WithExpectStream(p.stream.Name), jetstream.WithStallWait(stall))
	if err != nil {
		return nil, fmt.Errorf("publish event %s: %w", e.ID, err)
	}
	return f, nil
}

// positionHeader carries an event's log position (outbox.Checkpoint), in
// decimal; a replay's messages have none.
const positionHeader = "Orderd-Position"

// Position returns the log position a message carries, 0 when none.
func Position(h nats.Header) uint64 {
	n, _ := strconv.ParseUint(h.Get(positionHeader), 10, 64)
	return n
}

// ackOf returns f's ack once it is in, or the error that refused it or
// ended wait, which ctx (the caller's) may have ended. An ack already in
// counts even when wait has ended.
func ackOf(wait, ctx context.Context, f jetstream.PubAckFuture, within time.Duration) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	default:
	}
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-wait.Done():
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for JetStream acks: %w", ctx.Err())
		}
		return nil, fmt.Errorf("wait for JetStream acks: none within %s", within.Round(time.Millisecond))
	}
}

// Positions reads the messages the stream has stored since the given time
// (the server's clock), their headers only, up to the last one stored
// when it is called, and returns the log position of each event among
// them that carries one, by event id (Nats-Msg-Id), and the highest
// position, at least floor. A relay catching up from the log gives the
// events already published their positions again, so that a position
// names one event whatever the relay publishes twice. Errors:
// domain.ErrUnavailable (wrapped) when the stream cannot be read.
func (p *Publisher) Positions(ctx context.Context, since time.Time, floor uint64) (map[string]uint64, uint64, error) {
	// The ordered consumer's Fetch takes no context: while the client is
	// not connected it would wait in its requests (10 s each), and by
	// default re-create its consumer for ever (a relay stopped in it while
	// NATS was down, TestRelayPublishesThroughAnOutage).
	if s := p.js.Conn().Status(); s != nats.CONNECTED {
		return nil, 0, fmt.Errorf("stream %s: %w: the NATS connection is %s", p.stream.Name, domain.ErrUnavailable, s)
	}
	// The lookup reads the stream's info: its last message now.
	st, err := p.js.Stream(ctx, p.stream.Name)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: %w: %v", p.stream.Name, domain.ErrUnavailable, err)
	}
	info := st.CachedInfo()
	byEvent, top := map[string]uint64{}, floor
	last := info.State.LastSeq
	if info.State.Msgs == 0 || last == 0 {
		return byEvent, top, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime: &since, HeadersOnly: true, MaxResetAttempts: 1})
	if err != nil {
		return nil, 0, fmt.Errorf("read %s since %s: %w: %v", p.stream.Name, since.Format(time.RFC3339), domain.ErrUnavailable, err)
	}
	for {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w: %v", p.stream.Name, domain.ErrUnavailable, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return nil, 0, fmt.Errorf("read %s: %w", p.stream.Name, err)
			}
			if pos := Position(m.Headers()); pos > 0 {
				byEvent[m.Headers().Get(jetstream.MsgIDHeader)] = pos
				top = max(top, pos)
			}
			if meta.Sequence.Stream >= last {
				return byEvent, top, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, 0, fmt.Errorf("read %s: %w: %v", p.stream.Name, domain.ErrUnavailable, err)
		}
		if got == 0 {
			// Nothing stored since: the stream's last message is older.
			return byEvent, top, nil
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
	}
}
