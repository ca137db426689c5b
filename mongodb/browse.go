package mongodb

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
)

// The log browser: pages of the whole log, newest commit first, for the
// operator console. Not a hot path, but a page never reads the whole log:
// a page of every commit, or of one correlation id, is one ranged query on
// an index; a page filtered by event type examines the log newest first
// until it has its commits, reaches the log's end or runs out of time.

// browseBudget is how long a page filtered by event type searches before
// it answers with what it found and the cursor where it stopped
// (domain.LogPage.DeadlineReached): the filter has no index (eight types,
// each in a large share of the commits, would make an index that costs
// every append and narrows little), so a rare type is searched window by
// window.
const browseBudget = 2 * time.Second

// browseWindow is how many commits one step of a type search examines on
// MongoDB, and browseChunk on the embedded store, which reads them.
const (
	browseWindow = 2048
	browseChunk  = 256
)

// WithBrowseSearch makes a page filtered by event type search for budget,
// examining step commits at a time, instead of browseBudget and
// browseWindow (MongoDB) or browseChunk (the embedded store).
func WithBrowseSearch(budget time.Duration, step int) EventStoreOption {
	return func(s *EventStore) { s.searchBudget, s.searchStep = budget, step }
}

// Cursor kinds: which order a cursor continues.
const (
	cursorRecorded = "t" // (recorded_at ms, _id) of the last commit shown or examined
	cursorStream   = "s" // one stream: first_version of the last commit shown
)

func encodeCursor(parts ...string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strings.Join(parts, "|")))
}

// decodeCursor returns the cursor's parts after checking its kind and
// count; errors wrap domain.ErrValidation.
func decodeCursor(cursor, kind string, n int) ([]string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	parts := strings.Split(string(raw), "|")
	if err != nil || len(parts) != n || parts[0] != kind {
		return nil, fmt.Errorf("cursor %q: not a cursor of this query: %w", cursor, domain.ErrValidation)
	}
	return parts, nil
}

// Browse returns a page of the log, newest commit first (domain.LogQuery,
// domain.LogPage). A page of every commit, or of one correlation id, is one
// ranged query on the (recorded_at, _id) index, or on the
// events.correlation_id index; one stream's, one on the (stream_id,
// first_version) index; a page filtered by event type examines the log
// newest first for at most browseBudget. The embedded store serves the
// log's ranged queries from SQLite indexes (internal/embedded/logpage.go).
// Errors: domain.ErrValidation (wrapped) for a cursor of another query,
// domain.ErrUnavailable.
func (s *EventStore) Browse(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	q.Limit = min(max(q.Limit, 1), 200)
	dialect, err := s.dialect.of(ctx, s.commits.Database())
	if err != nil {
		return domain.LogPage{}, err
	}
	if q.StreamID != "" {
		if dialect == DialectFerretDB {
			// A filter on stream_id decodes the whole log in Go (see
			// commitsFrom); the stream's chain of _id look-ups reads the
			// _id index.
			return s.browseChain(ctx, q)
		}
		return s.browseStream(ctx, q)
	}
	var older bson.A
	if q.Cursor != "" {
		parts, err := decodeCursor(q.Cursor, cursorRecorded, 3)
		if err != nil {
			return domain.LogPage{}, err
		}
		ms, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return domain.LogPage{}, fmt.Errorf("cursor %q: %w", q.Cursor, domain.ErrValidation)
		}
		older = below(time.UnixMilli(ms), parts[2])
	}
	deadline := time.Now().Add(cmp.Or(s.searchBudget, browseBudget))
	if q.Type != "" && q.CorrelationID == "" && dialect == DialectMongoDB {
		return s.searchWindows(ctx, q, older, deadline, cmp.Or(s.searchStep, browseWindow))
	}
	// The embedded store filters events.type in Go over the whole log:
	// there the search reads the commits and matches them here.
	return s.searchPages(ctx, q, older, deadline, cmp.Or(s.searchStep, browseChunk))
}

// LogCommit returns the commit id with its events; found is false when
// the log has none. Errors: domain.ErrUnavailable.
func (s *EventStore) LogCommit(ctx context.Context, id string) (c domain.LogCommit, found bool, err error) {
	raw, err := s.commits.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return domain.LogCommit{}, false, nil
	}
	if err != nil {
		return domain.LogCommit{}, false, fmt.Errorf("read commit %s: %w", id, Translate(err))
	}
	return logCommitOf(decodeCommit(raw)), true, nil
}

// logCommitOf is the commit d as the log browser shows it; unreadable is
// its decoder's error (decodeCommit), which it then shows instead of its
// events, as it does an event's.
func logCommitOf(d commitDoc, unreadable error) domain.LogCommit {
	out := domain.LogCommit{ID: d.ID, StreamID: d.StreamID, StreamType: d.StreamType, FirstVersion: d.FirstVersion,
		LastVersion: d.LastVersion, RecordedAt: d.RecordedAt.UTC(), Events: []domain.Event{}}
	evs, err := d.events()
	if err = cmp.Or(unreadable, err); err != nil {
		out.Error = err.Error()
		return out
	}
	out.Events = evs
	return out
}

var newestFirst = bson.D{{Key: "recorded_at", Value: -1}, {Key: "_id", Value: -1}}

// below is the $or of the commits older than (at, id) in the log's
// newest-first order.
func below(at time.Time, id string) bson.A {
	return bson.A{
		bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: at}}}},
		bson.D{{Key: "recorded_at", Value: at}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: id}}}},
	}
}

// allOf is the filter of every condition of conds.
func allOf(conds bson.A) bson.D {
	if len(conds) == 0 {
		return bson.D{}
	}
	return bson.D{{Key: "$and", Value: conds}}
}

func recordedCursor(c domain.LogCommit) string {
	return encodeCursor(cursorRecorded, strconv.FormatInt(c.RecordedAt.UnixMilli(), 10), c.ID)
}

// searchPages reads the log newest first, n commits a query (q.Limit, or
// step when q filters by type) older than the bound older (nil:
// from the newest), of q's correlation id if it names one, and keeps the
// commits q matches until it has q.Limit of them, reaches the log's end or
// passes deadline after a query.
func (s *EventStore) searchPages(ctx context.Context, q domain.LogQuery, older bson.A, deadline time.Time, step int) (domain.LogPage, error) {
	n := q.Limit
	if q.Type != "" {
		n = step
	}
	page := domain.LogPage{Commits: []domain.LogCommit{}}
	for {
		filter := bson.D{}
		if q.CorrelationID != "" {
			filter = append(filter, bson.E{Key: "events.correlation_id", Value: q.CorrelationID})
		}
		if older != nil {
			filter = append(filter, bson.E{Key: "$or", Value: older})
		}
		cur, err := s.commits.Find(ctx, filter, options.Find().SetSort(newestFirst).SetLimit(int64(n)))
		if err != nil {
			return domain.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
		}
		chunk, err := readPage(ctx, cur)
		if err != nil {
			return domain.LogPage{}, err
		}
		for _, c := range chunk.Commits {
			if !q.Matches(c) {
				continue
			}
			if page.Commits = append(page.Commits, c); len(page.Commits) == q.Limit {
				page.Next = recordedCursor(c)
				return page, nil
			}
		}
		if len(chunk.Commits) < n {
			return page, nil
		}
		last := chunk.Commits[len(chunk.Commits)-1]
		if older = below(last.RecordedAt, last.ID); !time.Now().Before(deadline) {
			page.Next, page.DeadlineReached = recordedCursor(last), true
			return page, nil
		}
	}
}

// searchWindows is a search by event type on MongoDB: the server filters
// each window of step commits older than the bound older, whose
// end it finds on the (recorded_at, _id) index alone, until the page has
// q.Limit commits, the log ends or deadline passes after a window.
func (s *EventStore) searchWindows(ctx context.Context, q domain.LogQuery, older bson.A, deadline time.Time, step int) (domain.LogPage, error) {
	page := domain.LogPage{Commits: []domain.LogCommit{}}
	for {
		bound := bson.A{}
		if older != nil {
			bound = append(bound, bson.D{{Key: "$or", Value: older}})
		}
		var floor *commitKey
		var k commitKey
		err := s.commits.FindOne(ctx, allOf(bound), options.FindOne().SetSort(newestFirst).
			SetSkip(int64(step-1)).SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "recorded_at", Value: 1}})).Decode(&k)
		switch {
		case err == nil:
			floor = &k
			bound = append(bound, bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$gt", Value: k.RecordedAt}}}},
				bson.D{{Key: "recorded_at", Value: k.RecordedAt}, {Key: "_id", Value: bson.D{{Key: "$gte", Value: k.ID}}}},
			}}})
		case !errors.Is(err, mongo.ErrNoDocuments):
			return domain.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
		}
		filter := allOf(append(bound, bson.D{{Key: "events.type", Value: q.Type}}))
		cur, err := s.commits.Find(ctx, filter, options.Find().SetSort(newestFirst).SetLimit(int64(q.Limit-len(page.Commits))))
		if err != nil {
			return domain.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
		}
		found, err := readPage(ctx, cur)
		if err != nil {
			return domain.LogPage{}, err
		}
		if page.Commits = append(page.Commits, found.Commits...); len(page.Commits) == q.Limit {
			page.Next = recordedCursor(page.Commits[len(page.Commits)-1])
			return page, nil
		}
		if floor == nil {
			return page, nil
		}
		older = below(floor.RecordedAt, floor.ID)
		if !time.Now().Before(deadline) {
			page.Next = encodeCursor(cursorRecorded, strconv.FormatInt(floor.RecordedAt.UnixMilli(), 10), floor.ID)
			page.DeadlineReached = true
			return page, nil
		}
	}
}

// browseStream pages one stream on the (stream_id, first_version) index.
func (s *EventStore) browseStream(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	filter := bson.D{{Key: "stream_id", Value: q.StreamID}}
	if q.Cursor != "" {
		before, err := streamCursor(q)
		if err != nil {
			return domain.LogPage{}, err
		}
		filter = append(filter, bson.E{Key: "first_version", Value: bson.D{{Key: "$lt", Value: before}}})
	}
	if q.Type != "" {
		filter = append(filter, bson.E{Key: "events.type", Value: q.Type})
	}
	if q.CorrelationID != "" {
		filter = append(filter, bson.E{Key: "events.correlation_id", Value: q.CorrelationID})
	}
	cur, err := s.commits.Find(ctx, filter, options.Find().
		SetSort(bson.D{{Key: "stream_id", Value: -1}, {Key: "first_version", Value: -1}}).SetLimit(int64(q.Limit)))
	if err != nil {
		return domain.LogPage{}, fmt.Errorf("browse %s: %w", q.StreamID, Translate(err))
	}
	page, err := readPage(ctx, cur)
	if err == nil && len(page.Commits) == q.Limit {
		page.Next = encodeCursor(cursorStream, q.StreamID, strconv.FormatInt(page.Commits[len(page.Commits)-1].FirstVersion, 10))
	}
	return page, err
}

// streamCursor is the first version a stream cursor continues below.
func streamCursor(q domain.LogQuery) (int64, error) {
	parts, err := decodeCursor(q.Cursor, cursorStream, 3)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || parts[1] != q.StreamID {
		return 0, fmt.Errorf("cursor %q: not a cursor of stream %s: %w", q.Cursor, q.StreamID, domain.ErrValidation)
	}
	return v, nil
}

func readPage(ctx context.Context, cur *mongo.Cursor) (domain.LogPage, error) {
	defer cur.Close(context.WithoutCancel(ctx))
	page := domain.LogPage{Commits: []domain.LogCommit{}}
	for cur.Next(ctx) {
		page.Commits = append(page.Commits, logCommitOf(decodeCommit(cur.Current)))
	}
	if err := cur.Err(); err != nil {
		return domain.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
	}
	return page, nil
}

// browseChain pages one stream read by its chain of _id look-ups
// (FerretDB); streams are short, so the whole stream is read.
func (s *EventStore) browseChain(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	before := int64(1<<63 - 1)
	if q.Cursor != "" {
		v, err := streamCursor(q)
		if err != nil {
			return domain.LogPage{}, err
		}
		before = v
	}
	docs, err := s.chain(ctx, q.StreamID, 1)
	if err != nil {
		return domain.LogPage{}, err
	}
	page := domain.LogPage{Commits: []domain.LogCommit{}}
	for i := len(docs) - 1; i >= 0; i-- {
		if docs[i].FirstVersion >= before {
			continue
		}
		if len(page.Commits) == q.Limit {
			last := page.Commits[len(page.Commits)-1]
			page.Next = encodeCursor(cursorStream, q.StreamID, strconv.FormatInt(last.FirstVersion, 10))
			break
		}
		if c := logCommitOf(docs[i], nil); q.Matches(c) {
			page.Commits = append(page.Commits, c)
		}
	}
	return page, nil
}
