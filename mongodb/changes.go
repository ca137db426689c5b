package mongodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
)

// The log's change stream: what the outbox relay reads (invariant 3). The
// log is insert-only (invariant 2), so its inserts, in the order the store
// committed them, are everything that ever happens to it.

// tailAwait is how long one getMore of Tail waits for a commit before it
// answers empty: the most an idle relay waits before it can renew its
// lease or stop.
const tailAwait = time.Second

// insertsOnly is the pipeline of Tail's change stream: the log is
// insert-only, and the embedded store serves streams of inserts only.
var insertsOnly = mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}}

// Tail follows the log's change stream: it calls fn with each batch of
// commits inserted after the position after (a resume token, as a BSON
// document, that an earlier call passed to fn; nil: the log's end when the
// stream opens), in the order the store committed them, at most batch at
// a time, and with next, the position after the batch. It first calls fn
// with no commits once the stream is open (next is then where it opened),
// and again whenever tailAwait passes with no new commit, so fn runs at
// least about every second. The stream is read with read concern majority
// (ClientOptions): nothing a failover can roll back is ever passed to fn.
//
// Tail returns fn's error, ctx's, or the stream's: domain.ErrHistoryLost
// (wrapped) when it cannot resume from after (the store no longer holds
// the history after it: it fell off MongoDB's oplog, or the collection was
// dropped and created again, ChangeStreamHistoryLost, code 286, and its
// relatives), domain.ErrUnavailable when the store cannot be reached
// (the driver has already resumed the stream once by then). A commit that
// does not decode comes with its Err set.
func (s *EventStore) Tail(ctx context.Context, after []byte, batch int, fn func(commits []domain.RecordedCommit, next []byte) error) error {
	opts := options.ChangeStream().SetBatchSize(int32(batch)).SetMaxAwaitTime(tailAwait)
	if after != nil {
		opts.SetResumeAfter(bson.Raw(after))
	}
	cs, err := s.commits.Watch(ctx, insertsOnly, opts)
	if err != nil {
		return fmt.Errorf("watch the log: %w", translateStream(err))
	}
	defer cs.Close(context.WithoutCancel(ctx))
	// The position where the stream opened: the store's answer to the
	// aggregate that opened it, or after when that answer held commits.
	opened := cs.ResumeToken()
	if opened == nil {
		opened = after
	}
	if err := fn(nil, slices.Clone(opened)); err != nil {
		return err
	}
	// One batch is read ahead while fn handles the one before: the store's
	// answer and its decoding overlap the caller's publishing. The reader
	// alone uses the stream, and Tail returns only once it has stopped.
	rctx, cancel := context.WithCancel(ctx)
	reads := make(chan tailRead, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(reads)
		for {
			r := readBatch(rctx, cs, batch)
			select {
			case reads <- r:
			case <-rctx.Done():
				return
			}
			if r.err != nil {
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()
	for r := range reads {
		if r.err != nil {
			return r.err
		}
		if err := fn(r.commits, r.next); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// tailRead is one batch of Tail's stream: its commits and the position
// after them, or the error that ended the stream.
type tailRead struct {
	commits []domain.RecordedCommit
	next    []byte
	err     error
}

// readBatch reads one batch of the stream: one getMore, then what it
// returned, up to batch commits. TryNext waits at most tailAwait for the
// first commit and reads the rest of the batch from the driver's buffer.
func readBatch(ctx context.Context, cs *mongo.ChangeStream, batch int) tailRead {
	var commits []domain.RecordedCommit
	for len(commits) < batch && (len(commits) == 0 || cs.RemainingBatchLength() > 0) {
		if !cs.TryNext(ctx) {
			break
		}
		c, err := changedCommit(cs.Current)
		if err != nil {
			return tailRead{err: err}
		}
		commits = append(commits, c)
	}
	if err := cs.Err(); err != nil {
		return tailRead{err: fmt.Errorf("tail the log: %w", translateStream(err))}
	}
	if cs.ID() == 0 {
		// The server closed the stream (an invalidate: the collection was
		// dropped or renamed): no position after it resumes.
		return tailRead{err: fmt.Errorf("tail the log: the stream was closed by the store: %w", domain.ErrHistoryLost)}
	}
	return tailRead{commits: commits, next: slices.Clone(cs.ResumeToken())}
}

// changedCommit reads the commit inserted by one change event.
func changedCommit(ev bson.Raw) (domain.RecordedCommit, error) {
	doc, ok := ev.Lookup("fullDocument").DocumentOK()
	if !ok {
		op, _ := ev.Lookup("operationType").StringValueOK()
		return domain.RecordedCommit{}, fmt.Errorf("tail the log: a %q event without its document", op)
	}
	d, err := decodeCommit(doc)
	if err != nil {
		// How many events it holds, for their log positions, as far as
		// its array can be read.
		events, _ := doc.Lookup("events").ArrayOK()
		n, _ := events.Values()
		return domain.RecordedCommit{ID: d.ID, StreamID: d.StreamID, Count: len(n), Err: err}, nil
	}
	return d.recorded(), nil
}

// historyLostCodes are the answers, from MongoDB's error_codes.yml, of a
// store that cannot resume a change stream from a token: the history
// after it is gone (ChangeStreamHistoryLost), the token names another
// incarnation of the collection or no longer matches the stream
// (ChangeStreamFatalError), or the token is not one it can resume from
// (InvalidResumeToken).
var historyLostCodes = []int{
	286, // ChangeStreamHistoryLost
	280, // ChangeStreamFatalError
	260, // InvalidResumeToken
}

// translateStream is Translate for the errors of a change stream, with
// the answers that no retry from the same position can change wrapped in
// domain.ErrHistoryLost.
func translateStream(err error) error {
	var se mongo.ServerError
	if errors.As(err, &se) && slices.ContainsFunc(historyLostCodes, se.HasErrorCode) {
		return fmt.Errorf("%w: %v", domain.ErrHistoryLost, err)
	}
	return Translate(err)
}

// commitKey is what RecordedSince first reads of each commit: enough to
// order it.
type commitKey struct {
	ID           string    `bson:"_id"`
	StreamID     string    `bson:"stream_id"`
	FirstVersion int64     `bson:"first_version"`
	RecordedAt   time.Time `bson:"recorded_at"`
}

// RecordedSince calls fn with the commits recorded at or after since,
// batch at a time, oldest first by recorded_at, each stream's commits in
// version order: where clocks of appending instances disagree, a stream's
// later commit may carry the earlier time, and it then takes its
// predecessor's place. It reads the keys of the range first (on MongoDB an
// index range on recorded_at; on FerretDB, which filters in Go, a pass
// over the whole log), then the commits by _id, a batch at a time: this is
// the relay's catch-up when its change stream cannot resume, not a hot
// path. Errors: domain.ErrUnavailable, or fn's.
func (s *EventStore) RecordedSince(ctx context.Context, since time.Time, batch int, fn func([]domain.RecordedCommit) error) error {
	keys, err := findAll[commitKey](ctx, s.commits, bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$gte", Value: since}}}},
		options.Find().SetSort(bson.D{{Key: "recorded_at", Value: 1}}).
			SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "stream_id", Value: 1}, {Key: "first_version", Value: 1}, {Key: "recorded_at", Value: 1}}))
	if err != nil {
		return fmt.Errorf("read the log since %s: %w", since.Format(time.RFC3339Nano), err)
	}
	ids := inStreamOrder(keys)
	for len(ids) > 0 {
		chunk := ids[:min(batch, len(ids))]
		ids = ids[len(chunk):]
		docs, unreadable, err := s.commitsByID(ctx, chunk)
		if err != nil {
			return err
		}
		out := make([]domain.RecordedCommit, len(docs))
		for i, d := range docs {
			if unreadable[i] != nil {
				out[i] = domain.RecordedCommit{ID: d.ID, StreamID: d.StreamID, Err: unreadable[i]}
				continue
			}
			out[i] = d.recorded()
		}
		if err := fn(out); err != nil {
			return err
		}
	}
	return nil
}

// inStreamOrder returns the ids of keys (sorted by recorded_at) in that
// order, but with each stream's commits in version order in the places
// its commits hold.
func inStreamOrder(keys []commitKey) []string {
	byStream := map[string][]commitKey{}
	for _, k := range keys {
		byStream[k.StreamID] = append(byStream[k.StreamID], k)
	}
	for _, ks := range byStream {
		slices.SortStableFunc(ks, func(a, b commitKey) int { return int(a.FirstVersion - b.FirstVersion) })
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ks := byStream[k.StreamID]
		ids[i] = ks[0].ID
		byStream[k.StreamID] = ks[1:]
	}
	return ids
}

// OldestUnpublished returns the recorded time of the log's oldest commit
// that no relay of an earlier version marked published (those versions
// marked each commit {published: true} once JetStream acknowledged it;
// this one writes no marker, so every commit it appends counts): the
// point from which the first relay on an upgraded or new log publishes.
// found is false when there is none. On MongoDB it walks the recorded_at
// index from its start; on FerretDB it decodes the log. Both once, at the
// relay's first start on a log. Errors: domain.ErrUnavailable.
func (s *EventStore) OldestUnpublished(ctx context.Context) (at time.Time, found bool, err error) {
	k, found, err := findOne[commitKey](ctx, s.commits, bson.D{{Key: "published", Value: bson.D{{Key: "$ne", Value: true}}}},
		options.FindOne().SetSort(bson.D{{Key: "recorded_at", Value: 1}}).SetProjection(bson.D{{Key: "recorded_at", Value: 1}}))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("find the oldest unpublished commit: %w", err)
	}
	return k.RecordedAt, found, nil
}
