package eventstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// Log order: commits sorted by _id ("<stream id>:<first version>") come
// stream by stream, each stream's commits in version order, because stream
// ids cannot contain ':'. Streams therefore follow the order of their key,
// stream id + ":" (which differs from plain id order only when one id is a
// prefix of another), and a range of streams in log order is a range of
// _id: stream s starts at s+":" and everything after it starts at s+";".

// ScanRange selects streams of the log in log order (domain.ScanRange).
type ScanRange = domain.ScanRange

// StreamEvents is one stream's events in a scanned range
// (domain.StreamEvents).
type StreamEvents = domain.StreamEvents

func scanFilter(r ScanRange) bson.D {
	id := bson.D{}
	lo := ""
	if r.From != "" {
		lo = r.From + ":"
	}
	if r.After != "" {
		lo = max(lo, r.After+";")
	}
	if lo != "" {
		id = append(id, bson.E{Key: "$gte", Value: lo})
	}
	if r.To != "" {
		id = append(id, bson.E{Key: "$lt", Value: r.To + ":"})
	}
	f := bson.D{}
	if len(id) > 0 {
		f = append(f, bson.E{Key: "_id", Value: id})
	}
	rec := bson.D{}
	if !r.RecordedFrom.IsZero() {
		rec = append(rec, bson.E{Key: "$gte", Value: r.RecordedFrom})
	}
	if !r.RecordedTo.IsZero() {
		rec = append(rec, bson.E{Key: "$lt", Value: r.RecordedTo})
	}
	if len(rec) > 0 {
		f = append(f, bson.E{Key: "recorded_at", Value: rec})
	}
	return f
}

// Scan reads the streams of r in log order and calls fn once per stream
// with its events, until fn returns an error (which Scan returns). A whole
// stream is read before fn sees it. On MongoDB the read is a walk of the
// _id index; FerretDB 1.24 decodes and sorts the matching commits in
// memory first.
func (s *Store) Scan(ctx context.Context, r ScanRange, fn func(StreamEvents) error) error {
	cur, err := s.commits.Find(ctx, scanFilter(r), options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(512))
	if err != nil {
		return fmt.Errorf("scan log: %w", mongoerr.Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var cs StreamEvents
	flush := func() error {
		if cs.StreamID == "" {
			return nil
		}
		err := fn(cs)
		cs = StreamEvents{}
		return err
	}
	for cur.Next(ctx) {
		var d commitDoc
		if err := cur.Decode(&d); err != nil {
			return fmt.Errorf("scan log: decode commit: %w", err)
		}
		if d.StreamID != cs.StreamID {
			if err := flush(); err != nil {
				return err
			}
			cs.StreamID = d.StreamID
		}
		cs.Commits++
		if cs.Err != nil {
			continue
		}
		evs, err := d.events()
		if err != nil {
			cs.Err = err
			continue
		}
		cs.Events = append(cs.Events, evs...)
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("scan log: %w", mongoerr.Translate(err))
	}
	return flush()
}

// Commits returns the number of commits in the log, from the collection's
// metadata on MongoDB (a count of the whole table on FerretDB).
func (s *Store) Commits(ctx context.Context) (int64, error) {
	n, err := s.commits.EstimatedDocumentCount(ctx)
	if err != nil {
		return 0, fmt.Errorf("count commits: %w", mongoerr.Translate(err))
	}
	return n, nil
}

// Bounds splits a log of total commits (see Commits) into n ranges of
// about equal numbers of commits, cut at stream starts: it returns up to
// n-1 ascending stream ids, each the first stream of the next range (fewer
// when the log has fewer streams). Each bound is one skip over the _id
// index (a sort in memory on FerretDB).
func (s *Store) Bounds(ctx context.Context, n int, total int64) ([]string, error) {
	var out []string
	for i := 1; i < n; i++ {
		var d struct {
			StreamID string `bson:"stream_id"`
		}
		opts := options.FindOne().SetSort(bson.D{{Key: "_id", Value: 1}}).SetSkip(total * int64(i) / int64(n)).
			SetProjection(bson.D{{Key: "stream_id", Value: 1}})
		err := s.commits.FindOne(ctx, bson.D{}, opts).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("partition bound %d of %d: %w", i, n, mongoerr.Translate(err))
		}
		if len(out) == 0 || out[len(out)-1] < d.StreamID {
			out = append(out, d.StreamID)
		}
	}
	return out, nil
}

// eventMsg is the JetStream message of an event: its JSON on the stream's
// subject, with Nats-Msg-Id set to the event id.
func eventMsg(cfg StreamConfig, e domain.Event) (*nats.Msg, error) {
	body, err := domain.MarshalEvent(e)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: cfg.Subject(e.StreamID), Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, e.ID)
	return msg, nil
}

// Republish publishes events again (a replay of part of the log, for a new
// consumer or after the broker lost messages), each with its event id as
// Nats-Msg-Id, and waits for every ack. Copies of events the stream still
// remembers within its de-duplication window are dropped by the server;
// consumers' version guards skip the rest. It returns the number of events
// acknowledged.
func Republish(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, events []domain.Event) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	for _, e := range events {
		msg, err := eventMsg(cfg, e)
		if err != nil {
			return 0, fmt.Errorf("republish %s v%d: %w", e.StreamID, e.Version, err)
		}
		f, err := js.PublishMsgAsync(msg, jetstream.WithExpectStream(cfg.Name))
		if err != nil {
			return 0, fmt.Errorf("republish %s v%d: %w", e.StreamID, e.Version, err)
		}
		futures = append(futures, f)
	}
	acked := 0
	for _, f := range futures {
		select {
		case <-f.Ok():
			acked++
		case err := <-f.Err():
			return acked, fmt.Errorf("republish: %w", err)
		case <-ctx.Done():
			return acked, ctx.Err()
		}
	}
	return acked, nil
}
