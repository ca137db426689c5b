package mongodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
)

// CommitsCollection is the event log's collection: one document per commit.
const CommitsCollection = "events"

var _ domain.EventStore = (*EventStore)(nil)

// EventStore is the MongoDB event log. It keeps invariants 1, 2 and 7: a commit
// is one document, inserted whole or not at all, guarded by a unique index
// on (stream_id, first_version) and a unique index on (stream_id,
// idempotency_key) over the commits that have a key; a commit never
// changes after its insert. Every unique index starts with stream_id,
// so the collection can be sharded by stream_id.
//
// Appends are group-committed, as PostgreSQL flushes the WAL records of
// concurrent transactions in one write (commit_delay, "WAL
// Configuration") and EventStoreDB writes concurrent appends in one batch,
// but with no timer: an append that finds no insert in flight inserts its
// commit at once, so a lone command never waits for company; appends that
// arrive while an insert is in flight queue, and when it returns the first
// of them inserts everything queued (up to MaxAppendBatch commits) in one
// unordered insertMany, on its own goroutine. Each commit stays its own
// document, so a commit's atomicity and guards are those of a lone insert;
// each write error goes back to the append whose commit caused it (its
// statement index), and the others of the batch succeed.
type EventStore struct {
	commits *mongo.Collection
	metrics *EventStoreMetrics
	group   group // appends waiting for the insert in flight
	dialect dialectOf

	idBudget int // commit ids a scanByID pass holds

	searchBudget time.Duration // browseBudget unless configured
	searchStep   int           // browseWindow or browseChunk unless configured
}

// EventStoreOption configures an EventStore.
type EventStoreOption func(*EventStore)

// WithMetrics records append latency and conflicts in m.
func WithMetrics(m *EventStoreMetrics) EventStoreOption { return func(s *EventStore) { s.metrics = m } }

// New returns an EventStore on db's "events" collection. Call EnsureIndexes once
// at start-up before the first append.
func NewEventStore(db *mongo.Database, opts ...EventStoreOption) *EventStore {
	s := &EventStore{commits: db.Collection(CommitsCollection), idBudget: idBudget}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Names of the event collection's indexes.
const (
	indexStreamVersion = "stream_first_version"
	indexStreamKey     = "stream_idempotency_key"
	// indexGlobalKey is the unique index on idempotency_key alone that
	// earlier versions created; a collection sharded by stream_id cannot
	// have it, so EnsureIndexes drops it.
	indexGlobalKey = "idempotency_key"
	// indexRecorded orders the log by recorded_at, for the relay's
	// catch-up (RecordedSince), then by _id, so that the log browser
	// (Browse) pages newest first on it with a cursor (recorded_at, _id)
	// that is unique where times tie (a group commit records its commits
	// in one millisecond). It replaces indexRecordedOnly, which earlier
	// versions created: one index, not two, for every append to write.
	indexRecorded     = "recorded_at_id"
	indexRecordedOnly = "recorded_at"
	// indexCorrelation finds the commits of one correlation id for the
	// log browser, newest first: one key per commit (its events share
	// their command's correlation id) written by every append
	// (docs/embedded-store.md, "The log browser").
	indexCorrelation = "correlation_recorded_at_id"
	// indexOutbox (the unpublished commits by recorded_at) and
	// indexOldOutbox (every commit on (published, recorded_at)) are the
	// outbox indexes of earlier versions, which marked each commit
	// published; EnsureIndexes drops them.
	indexOutbox    = "outbox_unpublished"
	indexOldOutbox = "outbox"
)

// EnsureIndexes creates the indexes the invariants rely on and drops the
// indexes earlier versions created that this one does not use (the
// unique index on idempotency_key alone, the outbox indexes). It is
// idempotent. Errors wrap domain.ErrUnavailable when the store cannot
// be reached.
func (s *EventStore) EnsureIndexes(ctx context.Context) error {
	// One index per createIndexes call: FerretDB 1.24 drops the connection
	// when one call names several indexes that already exist (a restart).
	err := createIndexes(ctx, s.commits, []mongo.IndexModel{
		{Keys: bson.D{{Key: "stream_id", Value: 1}, {Key: "first_version", Value: 1}},
			Options: options.Index().SetUnique(true).SetName(indexStreamVersion)},
		// Partial, not sparse: a sparse compound index holds every document
		// that has any of its fields, so commits without a key would all
		// be (stream_id, null) and collide within their stream (MongoDB
		// manual, "Sparse Compound Indexes"). The embedded store has no
		// partial indexes; its funnel creates this one as a plain unique
		// index, which there never holds a missing field.
		{Keys: bson.D{{Key: "stream_id", Value: 1}, {Key: "idempotency_key", Value: 1}},
			Options: options.Index().SetUnique(true).SetName(indexStreamKey).
				SetPartialFilterExpression(bson.D{{Key: "idempotency_key", Value: bson.D{{Key: "$exists", Value: true}}}})},
	})
	if err != nil {
		return err
	}
	// The global key index is dropped after the per-stream one exists, so
	// keys are guarded throughout; the outbox index before the recorded_at
	// index, which has its key (the embedded store creates a partial
	// index as a plain one, and refuses two of one key).
	for _, old := range []string{indexGlobalKey, indexOldOutbox, indexOutbox} {
		if err := dropIndexIfExists(ctx, s.commits, old); err != nil {
			return err
		}
	}
	// The new recorded_at index before the old one is dropped, so the
	// relay's catch-up always has one.
	if err := createIndexes(ctx, s.commits, []mongo.IndexModel{{Keys: bson.D{{Key: "recorded_at", Value: 1}, {Key: "_id", Value: 1}},
		Options: options.Index().SetName(indexRecorded)}, {Keys: bson.D{{Key: "events.correlation_id", Value: 1}, {Key: "recorded_at", Value: 1},
		{Key: "_id", Value: 1}}, Options: options.Index().SetName(indexCorrelation)}}); err != nil {
		return err
	}
	return dropIndexIfExists(ctx, s.commits, indexRecordedOnly)
}

func dropIndexIfExists(ctx context.Context, coll *mongo.Collection, name string) error {
	names, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		return fmt.Errorf("list indexes of %s: %w", coll.Name(), Translate(err))
	}
	for _, spec := range names {
		if spec.Name != name {
			continue
		}
		if err := coll.Indexes().DropOne(ctx, name); err != nil {
			return fmt.Errorf("drop index %s of %s: %w", name, coll.Name(), Translate(err))
		}
	}
	return nil
}

func createIndexes(ctx context.Context, coll *mongo.Collection, models []mongo.IndexModel) error {
	for _, m := range models {
		if _, err := coll.Indexes().CreateOne(ctx, m); err != nil {
			return fmt.Errorf("create index on %s: %w", coll.Name(), Translate(err))
		}
	}
	return nil
}

// Append stores c as one commit document, or nothing. It returns the
// commit's recorded time, or an error wrapping domain.ErrVersionConflict
// (a commit at that version exists), domain.ErrDuplicateRequest (a commit
// of the same stream holds the idempotency key; another stream's does not
// count), domain.ErrValidation (malformed commit), domain.ErrUnavailable,
// or ctx's error when ctx ended before the commit's batch was written
// (nothing is stored then). Once the batch is being written, Append waits
// for its outcome whatever ctx does.
func (s *EventStore) Append(ctx context.Context, c domain.Commit) (time.Time, error) {
	now := domain.Timestamp(time.Now())
	doc, err := newCommitDoc(c, now)
	if err != nil {
		return time.Time{}, err
	}
	start := time.Now()
	p := &pendingAppend{doc: doc, done: make(chan struct{})}
	if err := s.group.join(ctx, p); err != nil {
		return time.Time{}, fmt.Errorf("append %s at v%d: %w", c.StreamID, c.ExpectedVersion, err)
	}
	if p.batch != nil {
		s.writeBatch(ctx, p.batch)
	}
	err = p.err
	s.metrics.observeAppend(time.Since(start), err)
	if err != nil {
		if mongo.IsDuplicateKeyError(err) {
			return time.Time{}, s.duplicate(ctx, c)
		}
		return time.Time{}, fmt.Errorf("append %s at v%d: %w", c.StreamID, c.ExpectedVersion, Translate(err))
	}
	return now, nil
}

// duplicate tells which unique index an E11000 came from. FerretDB's error
// does not name the index, so it reads the commit at that version: if none
// is there, only the idempotency key, stored in an earlier commit of the
// same stream, can have collided.
func (s *EventStore) duplicate(ctx context.Context, c domain.Commit) error {
	d, found, err := findOne[commitDoc](ctx, s.commits, bson.D{{Key: "_id", Value: CommitID(c.StreamID, c.ExpectedVersion+1)}})
	switch {
	case err != nil:
		return fmt.Errorf("append %s at v%d: %w", c.StreamID, c.ExpectedVersion, err)
	case c.IdempotencyKey != "" && (!found || d.IdempotencyKey == c.IdempotencyKey):
		return fmt.Errorf("append %s: key %q: %w", c.StreamID, c.IdempotencyKey, domain.ErrDuplicateRequest)
	}
	s.metrics.conflict()
	return fmt.Errorf("append %s at v%d: %w", c.StreamID, c.ExpectedVersion, domain.ErrVersionConflict)
}

// findCommit reads the commit filter selects (what names it in errors);
// found is false when there is none. Errors: domain.ErrUnreadableCommit
// (wrapped) for a document that does not decode as a commit, which comes
// with its id and stream (decodeCommit); domain.ErrUnavailable.
func (s *EventStore) findCommit(ctx context.Context, what string, filter bson.D) (d commitDoc, found bool, err error) {
	raw, err := s.commits.FindOne(ctx, filter).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return commitDoc{}, false, nil
	}
	if err != nil {
		return commitDoc{}, false, fmt.Errorf("read %s: %w", what, Translate(err))
	}
	d, err = decodeCommit(raw)
	return d, true, err
}

// Load returns the stream's events after version after, in version order;
// none (and no error) for an unknown stream. after must be 0 or a head the
// caller saw (the last version of one of the stream's commits). Errors:
// domain.ErrUnreadableCommit (wrapped) for a commit this build cannot
// read, domain.ErrUnavailable.
func (s *EventStore) Load(ctx context.Context, streamID string, after int64) ([]domain.Event, error) {
	return s.eventsFrom(ctx, streamID, after+1, true)
}

// LoadFrom returns the stream's events with version >= from, in version
// order. Projections use it to fill gaps; from need not start a commit.
// Errors as Load's.
func (s *EventStore) LoadFrom(ctx context.Context, streamID string, from int64) ([]domain.Event, error) {
	return s.eventsFrom(ctx, streamID, max(from, 1), false)
}

// commitsFrom reads the stream's commits that hold versions from on, in
// order; starts says from is where a commit starts (a head the caller
// saw). On MongoDB it is one ranged query on the (stream_id,
// first_version) index.
func (s *EventStore) commitsFrom(ctx context.Context, streamID string, from int64, starts bool) ([]commitDoc, error) {
	dialect, err := s.dialect.of(ctx, s.commits.Database())
	if err != nil {
		return nil, err
	}
	if dialect == DialectFerretDB {
		// FerretDB decodes the whole log for a filter on stream_id; the
		// chain of _id look-ups reads its index (docs/embedded-store.md,
		// "One seam: the dialect").
		docs, err := s.chain(ctx, streamID, from)
		if err == nil && len(docs) == 0 && from > 1 && !starts {
			// Nothing starts at from: it is inside a commit, or past the head.
			docs, err = s.chain(ctx, streamID, 1)
		}
		return docs, err
	}
	filter := bson.D{{Key: "stream_id", Value: streamID}}
	if starts {
		filter = append(filter, bson.E{Key: "first_version", Value: bson.D{{Key: "$gte", Value: from}}})
	} else {
		filter = append(filter, bson.E{Key: "last_version", Value: bson.D{{Key: "$gte", Value: from}}})
	}
	var docs []commitDoc
	opts := options.Find().SetSort(bson.D{{Key: "stream_id", Value: 1}, {Key: "first_version", Value: 1}})
	err = eachFound(ctx, s.commits, fmt.Sprintf("load %s from v%d", streamID, from), filter, opts, func(cur *mongo.Cursor) error {
		d, err := decodeCommit(cur.Current)
		if err != nil {
			return fmt.Errorf("load %s: %w", streamID, err)
		}
		// The commits must continue each other from the one holding from,
		// as the chain of _id look-ups requires: a hole is a log this build
		// cannot make sense of, however often it is read.
		next := from
		if len(docs) > 0 {
			next = docs[len(docs)-1].LastVersion + 1
		}
		if d.StreamID != streamID || d.LastVersion < d.FirstVersion || d.FirstVersion > next || (len(docs) > 0 || starts) && d.FirstVersion != next {
			return fmt.Errorf("load %s: commit %s holds %s v%d..v%d where v%d was next: %w", streamID, d.ID, d.StreamID, d.FirstVersion, d.LastVersion, next, domain.ErrUnreadableCommit)
		}
		docs = append(docs, d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return docs, nil
}

// eventsFrom returns the stream's events from version from on, read by
// commitsFrom.
func (s *EventStore) eventsFrom(ctx context.Context, streamID string, from int64, starts bool) ([]domain.Event, error) {
	docs, err := s.commitsFrom(ctx, streamID, from, starts)
	if err != nil {
		return nil, err
	}
	var out []domain.Event
	for _, d := range docs {
		if d.LastVersion < from {
			continue
		}
		evs, err := d.events()
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			if e.Version >= from {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// chain reads a stream's commits in order, from the one that starts at
// version first. A commit that does not continue the chain is
// domain.ErrUnreadableCommit: the log says something this build cannot
// make sense of, however often it is read.
func (s *EventStore) chain(ctx context.Context, streamID string, first int64) ([]commitDoc, error) {
	var docs []commitDoc
	for next := first; ; {
		id := CommitID(streamID, next)
		d, found, err := s.findCommit(ctx, "commit "+id, bson.D{{Key: "_id", Value: id}})
		if err != nil {
			return nil, fmt.Errorf("load %s at v%d: %w", streamID, next, err)
		}
		if !found {
			return docs, nil
		}
		if d.StreamID != streamID || d.FirstVersion != next || d.LastVersion < next {
			return nil, fmt.Errorf("load %s: commit %s holds %s v%d..v%d: %w", streamID, d.ID, d.StreamID, d.FirstVersion, d.LastVersion, domain.ErrUnreadableCommit)
		}
		docs = append(docs, d)
		next = d.LastVersion + 1
	}
}

// FindIdempotencyKey returns the commit of stream streamID that stored
// key, read on MongoDB through the (stream_id, idempotency_key) index (one
// shard). Errors: domain.ErrNotFound (wrapped) when no commit of the
// stream holds key, also for an empty key or an invalid stream id;
// domain.ErrUnreadableCommit and domain.ErrUnavailable as Load's.
func (s *EventStore) FindIdempotencyKey(ctx context.Context, key, streamID string) (domain.Commit, error) {
	if key == "" || domain.ValidateID("stream id", streamID) != nil {
		return domain.Commit{}, fmt.Errorf("idempotency key %q in stream %q: %w", key, streamID, domain.ErrNotFound)
	}
	dialect, err := s.dialect.of(ctx, s.commits.Database())
	if err != nil {
		return domain.Commit{}, err
	}
	var d commitDoc
	found := false
	if dialect == DialectFerretDB {
		// A filter on the key decodes the whole log (see commitsFrom); the
		// stream's chain of _id look-ups reads the index.
		docs, err := s.chain(ctx, streamID, 1)
		if err != nil {
			return domain.Commit{}, err
		}
		if i := slices.IndexFunc(docs, func(c commitDoc) bool { return c.IdempotencyKey == key }); i >= 0 {
			d, found = docs[i], true
		}
	} else {
		d, found, err = s.findCommit(ctx, fmt.Sprintf("idempotency key %q in stream %s", key, streamID),
			bson.D{{Key: "stream_id", Value: streamID}, {Key: "idempotency_key", Value: key}})
		if err != nil {
			return domain.Commit{}, err
		}
	}
	if !found {
		return domain.Commit{}, fmt.Errorf("idempotency key %q in stream %s: %w", key, streamID, domain.ErrNotFound)
	}
	events, err := d.events()
	if err != nil {
		return domain.Commit{}, err
	}
	return domain.Commit{StreamID: d.StreamID, StreamType: d.StreamType, ExpectedVersion: d.FirstVersion - 1,
		Events: events, IdempotencyKey: d.IdempotencyKey, RequestHash: d.RequestHash}, nil
}
