package eventstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/sync/errgroup"

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
// stream is read before fn sees it.
//
// It holds the range's commit ids (about 40 bytes each) and one batch of
// commits in memory, never the range's commits: a first pass reads only
// the ids, unsorted (a walk of the _id index on MongoDB; on the embedded
// store, where only {_id: v} reaches an index and any sort is done in
// memory over whole documents, a streamed pass whose ids are then sorted
// here); then each batch of streams is read by _id look-ups, scanParallel
// at a time, and handed to fn stream by stream.
func (s *Store) Scan(ctx context.Context, r ScanRange, fn func(StreamEvents) error) error {
	ids, err := s.commitIDs(ctx, scanFilter(r))
	if err != nil {
		return err
	}
	for len(ids) > 0 {
		// Cut the batch at a stream's end, so each stream is read whole.
		n := min(len(ids), scanBatch)
		for n < len(ids) && streamOf(ids[n]) == streamOf(ids[n-1]) {
			n++
		}
		docs, unreadable, err := s.commitsByID(ctx, ids[:n])
		if err != nil {
			return err
		}
		ids = ids[n:]
		var cs StreamEvents
		for i, d := range docs {
			if d.StreamID != cs.StreamID {
				if cs.StreamID != "" {
					if err := fn(cs); err != nil {
						return err
					}
				}
				cs = StreamEvents{StreamID: d.StreamID}
			}
			cs.Commits++
			if cs.Err != nil {
				continue
			}
			if unreadable[i] != nil {
				cs.Err = unreadable[i]
				continue
			}
			evs, err := d.events()
			if err != nil {
				cs.Err = err
				continue
			}
			cs.Events = append(cs.Events, evs...)
		}
		if cs.StreamID != "" {
			if err := fn(cs); err != nil {
				return err
			}
		}
	}
	return nil
}

const (
	scanBatch    = 512 // commits read per batch of a Scan
	scanParallel = 8   // _id look-ups of a batch in flight at once
)

// streamOf is the stream id of a commit id (see CommitID).
func streamOf(commitID string) string {
	if i := strings.LastIndexByte(commitID, ':'); i >= 0 {
		return commitID[:i]
	}
	return commitID
}

// commitIDs returns the ids of the commits matching filter, in log order.
func (s *Store) commitIDs(ctx context.Context, filter bson.D) ([]string, error) {
	cur, err := s.commits.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(4096))
	if err != nil {
		return nil, fmt.Errorf("scan log ids: %w", mongoerr.Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var ids []string
	for cur.Next(ctx) {
		id, ok := cur.Current.Lookup("_id").StringValueOK()
		if !ok {
			return nil, fmt.Errorf("scan log ids: commit id %s is not a string", cur.Current.Lookup("_id"))
		}
		ids = append(ids, id)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("scan log ids: %w", mongoerr.Translate(err))
	}
	slices.Sort(ids)
	return ids, nil
}

// commitsByID reads the commits ids, in the order given. A commit whose
// document does not decode is left with only its stream id, and its error
// (domain.ErrUnreadableCommit) is at its index in unreadable: it spoils
// its stream, not the scan.
func (s *Store) commitsByID(ctx context.Context, ids []string) (docs []commitDoc, unreadable []error, err error) {
	docs, unreadable = make([]commitDoc, len(ids)), make([]error, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(scanParallel)
	for i, id := range ids {
		g.Go(func() error {
			d, found, err := s.findCommit(gctx, id)
			switch {
			case errors.Is(err, domain.ErrUnreadableCommit):
				docs[i], unreadable[i] = commitDoc{ID: id, StreamID: streamOf(id)}, err
			case err != nil:
				return fmt.Errorf("scan log: %w", err)
			case !found:
				// Commits are never deleted: the store lost it.
				return fmt.Errorf("scan log: commit %s: %w", id, domain.ErrNotFound)
			default:
				docs[i] = d
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return docs, unreadable, nil
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

// Bounds splits the log into n ranges of about equal numbers of commits,
// cut at stream starts: it returns up to n-1 ascending stream ids, each the
// first stream of the next range (fewer when the log has fewer streams).
// The cut is taken from one pass over the commit ids (see Scan); total
// (see Commits) is not needed for it.
func (s *Store) Bounds(ctx context.Context, n int, total int64) ([]string, error) {
	ids, err := s.commitIDs(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("partition bounds: %w", err)
	}
	var out []string
	for i := 1; i < n && len(ids) > 0; i++ {
		id := streamOf(ids[len(ids)*i/n])
		if len(out) == 0 || out[len(out)-1] < id {
			out = append(out, id)
		}
	}
	return out, nil
}
