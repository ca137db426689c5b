package mongodb

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
)

// The log browser: pages of the whole log, newest commit first, for the
// operator console. Not a hot path, but it must not read the whole log
// for a page: each page is bounded by its limit, and a filtered page by
// browseWindow commits examined.

// browseWindow is how many commits a page filtered by event type or
// correlation id examines at most: the filters have no index (an index
// on events.type or events.correlation_id would cost every append a
// multikey index write, for an operator's occasional search), so a rare
// value is found window by window as the operator pages older.
const browseWindow = 2048

// Cursor kinds: which order a cursor continues. Each is only valid with
// the query shape (and dialect) that made it.
const (
	cursorRecorded = "t" // MongoDB: (recorded_at ms, _id) of the last commit shown
	cursorPosition = "p" // FerretDB: change-stream position (rowid) of the last commit examined
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

// Browse returns a page of the log, newest commit first (admin.LogQuery,
// admin.LogPage). On MongoDB a page is one ranged query on the
// (recorded_at, _id) index, or on the (stream_id, first_version) index
// for one stream; a page filtered by type or correlation id first finds
// the end of its window of browseWindow commits on the (recorded_at, _id)
// index (index keys only), then reads the matches in that window. Errors:
// domain.ErrValidation (wrapped) for a cursor of another query,
// domain.ErrUnavailable.
func (s *EventStore) Browse(ctx context.Context, q admin.LogQuery) (admin.LogPage, error) {
	q.Limit = min(max(q.Limit, 1), 200)
	dialect, err := DialectOf(ctx, s.commits.Database().Client())
	if err != nil {
		return admin.LogPage{}, err
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
	if dialect == DialectFerretDB {
		// FerretDB sorts in Go after decoding every commit, and refuses
		// {$natural: -1} on a collection that is not capped
		// (handler/msg_find.go: "$natural sort for non-capped collection
		// is not supported"). The funnel's change stream reads SQLite's
		// rowid order, the log's commit order, through the table's rowid:
		// a page is a stream opened at a position below the cursor.
		// By positions a page is orders of magnitude faster than on
		// MongoDB's path (docs/embedded-store.md#the-log-browser).
		return s.browsePositions(ctx, q)
	}
	return s.browseRecorded(ctx, q)
}

// LogCommit returns the commit id with its events; found is false when
// the log has none. Errors: domain.ErrUnavailable.
func (s *EventStore) LogCommit(ctx context.Context, id string) (c admin.LogCommit, found bool, err error) {
	raw, err := s.commits.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return admin.LogCommit{}, false, nil
	}
	if err != nil {
		return admin.LogCommit{}, false, fmt.Errorf("read commit %s: %w", id, Translate(err))
	}
	return logCommitOf(raw), true, nil
}

// logCommitOf decodes a stored commit; one that does not decode keeps its
// id and stream, with the decoder's error.
func logCommitOf(raw bson.Raw) admin.LogCommit {
	var d commitDoc
	if err := bson.Unmarshal(raw, &d); err != nil {
		id, _ := raw.Lookup("_id").StringValueOK()
		return admin.LogCommit{ID: id, StreamID: streamOf(id), Events: []domain.Event{},
			Error: fmt.Sprintf("commit %s: %v: %v", id, domain.ErrUnreadableCommit, err)}
	}
	return logCommitOfDoc(d)
}

func logCommitOfDoc(d commitDoc) admin.LogCommit {
	out := admin.LogCommit{ID: d.ID, StreamID: d.StreamID, StreamType: d.StreamType, FirstVersion: d.FirstVersion,
		LastVersion: d.LastVersion, RecordedAt: d.RecordedAt.UTC(), Events: []domain.Event{}}
	evs, err := d.events()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Events = evs
	return out
}

// eventFilter is the query of LogQuery's type and correlation filters.
func eventFilter(q admin.LogQuery) bson.D {
	f := bson.D{}
	if q.Type != "" {
		f = append(f, bson.E{Key: "events.type", Value: q.Type})
	}
	if q.CorrelationID != "" {
		f = append(f, bson.E{Key: "events.correlation_id", Value: q.CorrelationID})
	}
	return f
}

var newestFirst = bson.D{{Key: "recorded_at", Value: -1}, {Key: "_id", Value: -1}}

// browseRecorded pages the whole log on the (recorded_at, _id) index.
func (s *EventStore) browseRecorded(ctx context.Context, q admin.LogQuery) (admin.LogPage, error) {
	older := bson.D{}
	if q.Cursor != "" {
		parts, err := decodeCursor(q.Cursor, cursorRecorded, 3)
		if err != nil {
			return admin.LogPage{}, err
		}
		ms, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			return admin.LogPage{}, fmt.Errorf("cursor %q: %w", q.Cursor, domain.ErrValidation)
		}
		at := time.UnixMilli(ms).UTC()
		older = bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$lt", Value: at}}}},
			bson.D{{Key: "recorded_at", Value: at}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: parts[2]}}}},
		}}}
	}
	filter := eventFilter(q)
	var floor *commitKey
	if len(filter) > 0 {
		// The window's last commit, read from the index alone.
		var k commitKey
		err := s.commits.FindOne(ctx, older, options.FindOne().SetSort(newestFirst).SetSkip(browseWindow-1).
			SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "recorded_at", Value: 1}})).Decode(&k)
		switch {
		case err == nil:
			floor = &k
			filter = append(filter, bson.E{Key: "$or", Value: bson.A{
				bson.D{{Key: "recorded_at", Value: bson.D{{Key: "$gt", Value: k.RecordedAt}}}},
				bson.D{{Key: "recorded_at", Value: k.RecordedAt}, {Key: "_id", Value: bson.D{{Key: "$gte", Value: k.ID}}}},
			}})
		case !errors.Is(err, mongo.ErrNoDocuments):
			return admin.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
		}
	}
	if len(older) > 0 {
		filter = append(bson.D{{Key: "$and", Value: bson.A{older}}}, filter...)
	}
	cur, err := s.commits.Find(ctx, filter, options.Find().SetSort(newestFirst).SetLimit(int64(q.Limit)))
	if err != nil {
		return admin.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
	}
	page, err := readPage(ctx, cur)
	if err != nil {
		return page, err
	}
	switch {
	case len(page.Commits) == q.Limit:
		last := page.Commits[len(page.Commits)-1]
		page.Next = encodeCursor(cursorRecorded, strconv.FormatInt(last.RecordedAt.UnixMilli(), 10), last.ID)
	case floor != nil:
		page.Next = encodeCursor(cursorRecorded, strconv.FormatInt(floor.RecordedAt.UnixMilli(), 10), floor.ID)
	}
	return page, nil
}

// browseStream pages one stream on the (stream_id, first_version) index.
func (s *EventStore) browseStream(ctx context.Context, q admin.LogQuery) (admin.LogPage, error) {
	filter := bson.D{{Key: "stream_id", Value: q.StreamID}}
	if q.Cursor != "" {
		before, err := streamCursor(q)
		if err != nil {
			return admin.LogPage{}, err
		}
		filter = append(filter, bson.E{Key: "first_version", Value: bson.D{{Key: "$lt", Value: before}}})
	}
	filter = append(filter, eventFilter(q)...)
	cur, err := s.commits.Find(ctx, filter, options.Find().
		SetSort(bson.D{{Key: "stream_id", Value: -1}, {Key: "first_version", Value: -1}}).SetLimit(int64(q.Limit)))
	if err != nil {
		return admin.LogPage{}, fmt.Errorf("browse %s: %w", q.StreamID, Translate(err))
	}
	page, err := readPage(ctx, cur)
	if err == nil && len(page.Commits) == q.Limit {
		page.Next = encodeCursor(cursorStream, q.StreamID, strconv.FormatInt(page.Commits[len(page.Commits)-1].FirstVersion, 10))
	}
	return page, err
}

// streamCursor is the first version a stream cursor continues below.
func streamCursor(q admin.LogQuery) (int64, error) {
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

func readPage(ctx context.Context, cur *mongo.Cursor) (admin.LogPage, error) {
	defer cur.Close(context.WithoutCancel(ctx))
	page := admin.LogPage{Commits: []admin.LogCommit{}}
	for cur.Next(ctx) {
		page.Commits = append(page.Commits, logCommitOf(cur.Current))
	}
	if err := cur.Err(); err != nil {
		return admin.LogPage{}, fmt.Errorf("browse the log: %w", Translate(err))
	}
	return page, nil
}

// browseChain pages one stream read by its chain of _id look-ups
// (FerretDB); streams are short, so the whole stream is read.
func (s *EventStore) browseChain(ctx context.Context, q admin.LogQuery) (admin.LogPage, error) {
	before := int64(1<<63 - 1)
	if q.Cursor != "" {
		v, err := streamCursor(q)
		if err != nil {
			return admin.LogPage{}, err
		}
		before = v
	}
	docs, err := s.chain(ctx, q.StreamID, 1)
	if err != nil {
		return admin.LogPage{}, err
	}
	page := admin.LogPage{Commits: []admin.LogCommit{}}
	for i := len(docs) - 1; i >= 0; i-- {
		if docs[i].FirstVersion >= before {
			continue
		}
		if len(page.Commits) == q.Limit {
			last := page.Commits[len(page.Commits)-1]
			page.Next = encodeCursor(cursorStream, q.StreamID, strconv.FormatInt(last.FirstVersion, 10))
			break
		}
		if c := logCommitOfDoc(docs[i]); q.Matches(c) {
			page.Commits = append(page.Commits, c)
		}
	}
	return page, nil
}

// browseChunk is how many positions one change stream of browsePositions
// reads.
const browseChunk = 256

// browsePositions pages the whole log by the embedded store's change
// stream positions (internal/embedded/changestream.go): a commit's
// clusterTime there is its SQLite rowid, commit order in the insert-only
// log, and a stream opened with startAtOperationTime t reads the rowids
// from t on through the table's rowid index. A page reads the positions
// just below the cursor, newest first, in chunks, filtering in Go, until
// it has Limit commits or examined browseWindow.
func (s *EventStore) browsePositions(ctx context.Context, q admin.LogQuery) (admin.LogPage, error) {
	var top int64 // the newest position to read
	if q.Cursor != "" {
		parts, err := decodeCursor(q.Cursor, cursorPosition, 2)
		if err != nil {
			return admin.LogPage{}, err
		}
		p, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil || p < 1 {
			return admin.LogPage{}, fmt.Errorf("cursor %q: %w", q.Cursor, domain.ErrValidation)
		}
		top = p - 1
	} else {
		end, err := s.logEnd(ctx)
		if err != nil {
			return admin.LogPage{}, err
		}
		top = end
	}
	page := admin.LogPage{Commits: []admin.LogCommit{}}
	examined := 0
	for top >= 1 {
		n := browseChunk
		if q.Type == "" && q.CorrelationID == "" {
			n = q.Limit - len(page.Commits)
		}
		from := max(top-int64(n)+1, 1)
		chunk, err := s.positions(ctx, from, top)
		if err != nil {
			return admin.LogPage{}, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			examined++
			if q.Matches(chunk[i].commit) {
				page.Commits = append(page.Commits, chunk[i].commit)
			}
			if len(page.Commits) == q.Limit || examined >= browseWindow {
				if chunk[i].pos > 1 {
					page.Next = encodeCursor(cursorPosition, strconv.FormatInt(chunk[i].pos, 10))
				}
				return page, nil
			}
		}
		top = from - 1
	}
	return page, nil
}

type positioned struct {
	pos    int64
	commit admin.LogCommit
}

// logEnd is the embedded store's newest change-stream position: the rowid
// in the resume token of a stream opened at the log's end ({_data: hex of
// a version byte, the collection's uuid, the rowid big-endian}).
func (s *EventStore) logEnd(ctx context.Context) (int64, error) {
	cs, err := s.commits.Watch(ctx, insertsOnly)
	if err != nil {
		return 0, fmt.Errorf("browse the log: %w", translateStream(err))
	}
	defer cs.Close(context.WithoutCancel(ctx))
	data, _ := bson.Raw(cs.ResumeToken()).Lookup("_data").StringValueOK()
	b, err := hex.DecodeString(data)
	if err != nil || len(b) != 25 {
		return 0, fmt.Errorf("browse the log: resume token %q is not the embedded store's", data)
	}
	var end int64
	for _, c := range b[17:] {
		end = end<<8 | int64(c)
	}
	return end, nil
}

// positions reads the commits at change-stream positions from..to,
// oldest first.
func (s *EventStore) positions(ctx context.Context, from, to int64) ([]positioned, error) {
	at := bson.Timestamp{T: uint32(uint64(from) >> 32), I: uint32(from)}
	cs, err := s.commits.Watch(ctx, insertsOnly, options.ChangeStream().SetStartAtOperationTime(&at).
		SetBatchSize(int32(to-from+1)).SetMaxAwaitTime(50*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("browse the log: %w", translateStream(err))
	}
	defer cs.Close(context.WithoutCancel(ctx))
	var out []positioned
	// The first TryNext answers the aggregate's empty first batch: false
	// without a getMore. A second false is a getMore that found nothing
	// up to to (a hole in the rowids) within its await.
	for misses := 0; misses < 2; {
		if !cs.TryNext(ctx) {
			if cs.Err() != nil {
				break
			}
			misses++
			continue
		}
		t, i, _ := cs.Current.Lookup("clusterTime").TimestampOK()
		pos := int64(uint64(t)<<32 | uint64(i))
		if pos > to {
			break
		}
		doc, _ := cs.Current.Lookup("fullDocument").DocumentOK()
		out = append(out, positioned{pos: pos, commit: logCommitOf(doc)})
		if pos == to {
			break
		}
	}
	if err := cs.Err(); err != nil {
		return nil, fmt.Errorf("browse the log: %w", translateStream(err))
	}
	return slices.Clip(out), nil
}
