package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
	"github.com/orderd/orderd/tracing"
)

// shutdownGrace bounds what a shutdown waits for: the acks of a round
// under way (from the cancellation on; its markers keep the round's own
// deadline), and the last round of queued commits. Long enough for acks already on the wire,
// short enough not to hold up a shutdown when NATS is down.
const shutdownGrace = 2 * time.Second

// outbox publishes commits and writes their published markers: the one
// publish path of the Relay and the Sweeper.
type outbox struct {
	commits *mongo.Collection
	js      jetstream.JetStream
	stream  StreamConfig
	log     *slog.Logger
	metrics *Metrics
}

func newOutbox(db *mongo.Database, js jetstream.JetStream, stream StreamConfig, log *slog.Logger, m *Metrics) outbox {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return outbox{commits: db.Collection(CommitsCollection), js: js, stream: stream, log: log, metrics: m}
}

// send publishes the events of docs as async publishes (the JetStream
// context's WithPublishAsyncMaxPending bounds how many await their acks;
// a full window makes the send wait) and waits for the acks, all within
// ackTimeout. It returns the ids of the commits whose every event was
// acknowledged, also alongside an error (a publish or an ack failed); the
// others stay in the outbox for the sweep. A commit that cannot be decoded
// is logged, counted as a publish error and left in the outbox, where the
// backlog metrics show it. A canceled ctx still sends (the final round of
// a shutdown) but waits at most shutdownGrace for acks.
func (o *outbox) send(ctx context.Context, docs []commitDoc, ackTimeout time.Duration) ([]string, error) {
	type sent struct {
		doc     commitDoc
		futures []jetstream.PubAckFuture
		span    trace.Span
	}
	if ctx.Err() != nil {
		ackTimeout = min(ackTimeout, shutdownGrace)
	}
	deadline := time.Now().Add(ackTimeout)
	var (
		out     []sent
		sendErr error
	)
	for _, d := range docs {
		if sendErr != nil {
			break
		}
		correlation := ""
		if len(d.Events) > 0 {
			correlation = d.Events[0].CorrelationID
		}
		_, span := tracer.Start(tracing.InCorrelationTrace(ctx, correlation), "relay.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("orderd.stream_id", d.StreamID), attribute.Int64("orderd.first_version", d.FirstVersion),
				attribute.Int("orderd.events", len(d.Events)), attribute.String("orderd.correlation_id", correlation)))
		events, err := d.events()
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			o.log.Error("commit cannot be decoded; it stays in the outbox", "commit", d.ID, "err", err)
			o.metrics.publishError()
			continue
		}
		s := sent{doc: d, span: span}
		for _, e := range events {
			f, err := publishAsync(o.js, o.stream, e, time.Until(deadline))
			if err != nil {
				sendErr = err
				break
			}
			s.futures = append(s.futures, f)
		}
		if sendErr != nil {
			span.SetStatus(codes.Error, sendErr.Error())
			span.End()
			break
		}
		out = append(out, s)
	}

	// Wait for the acks of what was sent, commit by commit: a commit is
	// marked only when every one of its events is acknowledged.
	w := newAckWait(ctx, time.Until(deadline))
	defer w.stop()
	var (
		acked  []string
		events int
		ackErr error // the first; the others are usually the same
	)
	for _, s := range out {
		var err error
		for _, f := range s.futures {
			if err = w.wait(f); err != nil {
				break
			}
		}
		if err != nil {
			if ackErr == nil {
				ackErr = err
			}
			s.span.SetStatus(codes.Error, err.Error())
		} else {
			acked = append(acked, s.doc.ID)
			events += len(s.futures)
		}
		s.span.End()
	}
	o.metrics.publishedEvents(events)
	if err := errors.Join(sendErr, ackErr); err != nil {
		o.metrics.publishError()
		return acked, fmt.Errorf("publish %d commits (%d acknowledged): %w", len(docs), len(acked), err)
	}
	return acked, nil
}

// publish sends docs (see send) and marks the acknowledged commits
// published, within ackTimeout for the acks and as long again for the
// markers (a shutdown that starts meanwhile lets the markers go on: the
// events are in the stream, and each marker lost costs a republish). It
// returns how many commits it marked, also alongside an error.
func (o *outbox) publish(ctx context.Context, docs []commitDoc, ackTimeout time.Duration) (int, error) {
	acked, err := o.send(ctx, docs, ackTimeout)
	if len(acked) == 0 {
		return 0, err
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	marked, merr := o.mark(mctx, acked)
	if merr != nil {
		err = errors.Join(err, fmt.Errorf("%d of %d acknowledged commits marked: %w", marked, len(acked), merr))
	}
	return marked, err
}

// connected reports whether the NATS connection can publish now.
func (o *outbox) connected() bool {
	nc := o.js.Conn()
	return nc != nil && nc.IsConnected()
}

// ackWait waits for acks until one deadline for all of them, or until
// shutdownGrace after ctx is done; after either it gives up at once.
type ackWait struct {
	ctx      context.Context
	timeout  *time.Timer
	within   time.Duration
	done     <-chan struct{}
	grace    <-chan time.Time
	gaveUpOn error
}

func newAckWait(ctx context.Context, within time.Duration) *ackWait {
	return &ackWait{ctx: ctx, timeout: time.NewTimer(within), within: within.Round(time.Millisecond), done: ctx.Done()}
}

func (w *ackWait) stop() { w.timeout.Stop() }

// wait returns nil when f is acknowledged, or the error that refused it
// or ended the wait.
func (w *ackWait) wait(f jetstream.PubAckFuture) error {
	if w.gaveUpOn != nil {
		return w.gaveUpOn
	}
	// An ack already in counts even when the deadline has passed too.
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	default:
	}
	for {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-w.timeout.C:
			w.gaveUpOn = fmt.Errorf("wait for JetStream acks: none within %s", w.within)
			return w.gaveUpOn
		case <-w.grace:
			w.gaveUpOn = fmt.Errorf("wait for JetStream acks: %w", w.ctx.Err())
			return w.gaveUpOn
		case <-w.done:
			w.done, w.grace = nil, time.After(shutdownGrace)
		}
	}
}

// markChunk is the most published markers one bulk write carries. FerretDB
// 1.24 does not answer an update command of more than 64 statements (see
// package devstore); on MongoDB a chunk is one round trip.
const markChunk = 64

// mark sets the outbox marker of the commits ids with ordered bulk writes
// of markChunk updates by _id (the one filter the embedded store does not
// scan for), so a failure leaves a prefix marked and the rest for the
// sweep; it returns the length of that prefix. Not one update by $in:
// the embedded store scans the collection for it. Measured on the
// embedded store (500 markers on a 5,000-commit log): 2.5 s one updateOne
// at a time, 1.6 s in bulks of 50.
func (o *outbox) mark(ctx context.Context, ids []string) (int, error) {
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "published", Value: true}, {Key: "published_at", Value: domain.Timestamp(time.Now())}}}}
	for done := 0; done < len(ids); {
		chunk := ids[done:min(done+markChunk, len(ids))]
		models := make([]mongo.WriteModel, len(chunk))
		for i, id := range chunk {
			models[i] = mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}}).SetUpdate(set)
		}
		if _, err := o.commits.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true)); err != nil {
			var bwe mongo.BulkWriteException
			if errors.As(err, &bwe) && len(bwe.WriteErrors) > 0 {
				done += bwe.WriteErrors[0].Index
			}
			return done, fmt.Errorf("mark %d commits published: %w", len(ids)-done, mongoerr.Translate(err))
		}
		done += len(chunk)
	}
	return len(ids), nil
}
