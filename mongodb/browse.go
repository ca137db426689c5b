package mongodb

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
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
// first_version) index (on the embedded store, the stream's chain of _id
// look-ups); a page filtered by event type examines the log newest first
// for at most browseBudget. The embedded store serves the log's
// ranged queries from SQLite indexes (internal/embedded/logpage.go).
// Errors: domain.ErrValidation (wrapped) for a cursor of another query,
// domain.ErrUnavailable.
func (s *EventStore) Browse(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	q.Limit = min(max(q.Limit, 1), 200)
	dialect, err := s.dialect.of(ctx, s.commits.Database())
	if err != nil {
		return domain.LogPage{}, err
	}
	switch {
	case q.StreamID != "" && dialect == DialectMongoDB:
		return s.browseStream(ctx, q)
	case q.StreamID != "":
		return s.browseChain(ctx, q)
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
		older = below(commitKey{RecordedAt: time.UnixMilli(ms), ID: parts[2]})
	}
	deadline := time.Now().Add(cmp.Or(s.searchBudget, browseBudget))
	if q.Type != "" && q.CorrelationID == "" && dialect == DialectMongoDB {
		return s.search(ctx, q, older, deadline, s.filteredWindow(q, cmp.Or(s.searchStep, browseWindow)))
	}
	// The embedded store filters events.type in Go over the whole log:
	// there the search reads the commits and matches them here.
	return s.search(ctx, q, older, deadline, s.matchedWindow(q, cmp.Or(s.searchStep, browseChunk)))
}

// LogCommit returns the commit id with its events; found is false when
// the log has none. Errors: domain.ErrUnavailable.
func (s *EventStore) LogCommit(ctx context.Context, id string) (c domain.LogCommit, found bool, err error) {
	d, found, err := s.findCommit(ctx, "commit "+id, bson.D{{Key: "_id", Value: id}})
	if !found {
		return domain.LogCommit{}, false, err
	}
	return logCommitOf(d, err), true, nil
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

// below is the $or of the commits older than k in the log's newest-first
// order.
func below(k commitKey) bson.A {
	return bson.A{
		bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: k.RecordedAt}}}},
		bson.D{{Key: "recorded_at", Value: k.RecordedAt}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: k.ID}}}},
	}
}

func recordedCursor(k commitKey) string {
	return encodeCursor(cursorRecorded, strconv.FormatInt(k.RecordedAt.UnixMilli(), 10), k.ID)
}

// window is one step of a search: of the next commits older than the
// bound older (nil: from the newest), those q selects, newest first (the
// page needs want more), and the last commit the step examined, nil when
// it reached the log's end.
type window func(ctx context.Context, older bson.A, want int) (found []domain.LogCommit, last *commitKey, err error)

// search collects a page of q one window below the last at a time, from
// the bound older, until it has q.Limit commits, a window reaches the
// log's end or deadline passes after a window.
func (s *EventStore) search(ctx context.Context, q domain.LogQuery, older bson.A, deadline time.Time, next window) (domain.LogPage, error) {
	page := domain.LogPage{Commits: []domain.LogCommit{}}
	for {
		found, last, err := next(ctx, older, q.Limit-len(page.Commits))
		if err != nil {
			return domain.LogPage{}, err
		}
		for _, c := range found {
			if page.Commits = append(page.Commits, c); len(page.Commits) == q.Limit {
				page.Next = recordedCursor(commitKey{RecordedAt: c.RecordedAt, ID: c.ID})
				return page, nil
			}
		}
		if last == nil {
			return page, nil
		}
		if older = below(*last); !time.Now().Before(deadline) {
			page.Next, page.DeadlineReached = recordedCursor(*last), true
			return page, nil
		}
	}
}

// matchedWindow reads the commits of each window (the page's, or step
// when q filters by type), of q's correlation id if it names one, and
// keeps those q matches.
func (s *EventStore) matchedWindow(q domain.LogQuery, step int) window {
	return func(ctx context.Context, older bson.A, want int) ([]domain.LogCommit, *commitKey, error) {
		n := want
		if q.Type != "" {
			n = step
		}
		filter := bson.D{}
		if q.CorrelationID != "" {
			filter = append(filter, bson.E{Key: "events.correlation_id", Value: q.CorrelationID})
		}
		if older != nil {
			filter = append(filter, bson.E{Key: "$or", Value: older})
		}
		read, err := s.readPage(ctx, filter, newestFirst, n)
		if err != nil {
			return nil, nil, err
		}
		var last *commitKey
		if len(read) == n {
			last = &commitKey{RecordedAt: read[n-1].RecordedAt, ID: read[n-1].ID}
		}
		return slices.DeleteFunc(read, func(c domain.LogCommit) bool { return !q.Matches(c) }), last, nil
	}
}

// filteredWindow is a window of a search by event type on MongoDB: the
// server filters each window of step commits, whose end it finds on the
// (recorded_at, _id) index alone.
func (s *EventStore) filteredWindow(q domain.LogQuery, step int) window {
	return func(ctx context.Context, older bson.A, want int) ([]domain.LogCommit, *commitKey, error) {
		bound := bson.A{}
		if older != nil {
			bound = append(bound, bson.D{{Key: "$or", Value: older}})
		}
		var last *commitKey
		var k commitKey
		err := s.commits.FindOne(ctx, allOf(bound), options.FindOne().SetSort(newestFirst).
			SetSkip(int64(step-1)).SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "recorded_at", Value: 1}})).Decode(&k)
		switch {
		case err == nil:
			last = &k
			bound = append(bound, bson.D{{Key: "$or", Value: bson.A{
				bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$gt", Value: k.RecordedAt}}}},
				bson.D{{Key: "recorded_at", Value: k.RecordedAt}, {Key: "_id", Value: bson.D{{Key: "$gte", Value: k.ID}}}},
			}}})
		case !errors.Is(err, mongo.ErrNoDocuments):
			return nil, nil, fmt.Errorf("browse the log: %w", Translate(err))
		}
		found, err := s.readPage(ctx, allOf(append(bound, bson.D{{Key: "events.type", Value: q.Type}})), newestFirst, want)
		return found, last, err
	}
}

// allOf is the filter of every condition of conds.
func allOf(conds bson.A) bson.D {
	if len(conds) == 0 {
		return bson.D{}
	}
	return bson.D{{Key: "$and", Value: conds}}
}

// readPage reads the first n commits filter selects in the order sort.
func (s *EventStore) readPage(ctx context.Context, filter, sort bson.D, n int) ([]domain.LogCommit, error) {
	commits := []domain.LogCommit{}
	err := eachFound(ctx, s.commits, "browse the log", filter, options.Find().SetSort(sort).SetLimit(int64(n)), func(cur *mongo.Cursor) error {
		commits = append(commits, logCommitOf(decodeCommit(cur.Current)))
		return nil
	})
	return commits, err
}

// streamBefore is the first version a page of q's stream starts below:
// its cursor's, or past every version. Errors wrap domain.ErrValidation.
func streamBefore(q domain.LogQuery) (int64, error) {
	if q.Cursor == "" {
		return 1<<63 - 1, nil
	}
	parts, err := decodeCursor(q.Cursor, cursorStream, 3)
	if err != nil {
		return 0, err
	}
	before, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || parts[1] != q.StreamID {
		return 0, fmt.Errorf("cursor %q: not a cursor of stream %s: %w", q.Cursor, q.StreamID, domain.ErrValidation)
	}
	return before, nil
}

// browseStream pages one stream on MongoDB: one ranged query on the
// (stream_id, first_version) index.
func (s *EventStore) browseStream(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	before, err := streamBefore(q)
	if err != nil {
		return domain.LogPage{}, err
	}
	filter := bson.D{{Key: "stream_id", Value: q.StreamID}, {Key: "first_version", Value: bson.D{{Key: "$lt", Value: before}}}}
	if q.Type != "" {
		filter = append(filter, bson.E{Key: "events.type", Value: q.Type})
	}
	if q.CorrelationID != "" {
		filter = append(filter, bson.E{Key: "events.correlation_id", Value: q.CorrelationID})
	}
	commits, err := s.readPage(ctx, filter, bson.D{{Key: "stream_id", Value: -1}, {Key: "first_version", Value: -1}}, q.Limit)
	if err != nil {
		return domain.LogPage{}, err
	}
	page := domain.LogPage{Commits: commits}
	if len(commits) == q.Limit {
		page.Next = encodeCursor(cursorStream, q.StreamID, strconv.FormatInt(commits[len(commits)-1].FirstVersion, 10))
	}
	return page, nil
}

// browseChain pages one stream on the embedded store, read by its chain
// of _id look-ups (FerretDB would decode the whole log for a filter on
// stream_id); streams are short, so the whole stream is read.
func (s *EventStore) browseChain(ctx context.Context, q domain.LogQuery) (domain.LogPage, error) {
	before, err := streamBefore(q)
	if err != nil {
		return domain.LogPage{}, err
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
