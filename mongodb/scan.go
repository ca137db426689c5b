package mongodb

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/domain"
)

// Log order: commits sorted by _id ("<stream id>:<first version>") come
// stream by stream, each stream's commits in version order, because stream
// ids cannot contain ':'. Streams therefore follow the order of their key,
// stream id + ":" (which differs from plain id order only when one id is a
// prefix of another), and a range of streams in log order is a range of
// _id: stream s starts at s+":" and everything after it starts at s+";".

func scanFilter(r domain.ScanRange) bson.D {
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
// stream is read before fn sees it. It holds one batch of commits in
// memory, and on FerretDB up to 2^20 of the range's commit ids besides,
// reading a larger range in passes (see scanByID). Errors: fn's, domain.ErrUnavailable, and domain.ErrNotFound
// for a commit whose id was read and whose document then was not there.
func (s *EventStore) Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error {
	dialect, err := s.dialect.of(ctx, s.commits.Database())
	if err != nil {
		return fmt.Errorf("scan log: %w", err)
	}
	g := grouper{fn: fn}
	if dialect == DialectFerretDB {
		err = s.scanByID(ctx, r, &g)
	} else {
		err = s.scanSorted(ctx, r, &g)
	}
	if err != nil {
		return err
	}
	return g.flush()
}

// scanSorted reads the range in one query sorted by _id: on MongoDB a
// walk of the _id index that holds one batch of commits in memory.
func (s *EventStore) scanSorted(ctx context.Context, r domain.ScanRange, g *grouper) error {
	opts := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(scanBatch)
	return eachFound(ctx, s.commits, "scan log", scanFilter(r), opts, func(cur *mongo.Cursor) error {
		d, unreadable := decodeCommit(cur.Current)
		if d.ID == "" {
			return fmt.Errorf("scan log: commit id %s is not a string", cur.Current.Lookup("_id"))
		}
		return g.add(d, unreadable)
	})
}

// scanByID reads the range's commit ids first, unsorted, sorts them here,
// then reads the commits by _id, a batch at a time, each batch cut at a
// stream's end. It is for a store that sorts in memory: FerretDB sorts
// whole documents in Go (the peak RSS of BenchmarkRebuild's sorted scan,
// docs/benchmarks.md), while the ids take about 50 bytes per commit. A
// range of more than idBudget commits is read in passes, each over the
// ids of the range after the last stream of the one before.
func (s *EventStore) scanByID(ctx context.Context, r domain.ScanRange, g *grouper) error {
	for {
		ids, more, err := s.commitIDs(ctx, scanFilter(r), s.idBudget)
		if err != nil {
			return err
		}
		for i := 0; i < ids.len(); {
			n := min(ids.len(), i+scanBatch)
			for n < ids.len() && streamOf(ids.at(n)) == streamOf(ids.at(n-1)) {
				n++
			}
			batch := make([]string, 0, n-i)
			for ; i < n; i++ {
				batch = append(batch, ids.at(i))
			}
			docs, unreadable, err := s.commitsByID(ctx, batch)
			if err != nil {
				return err
			}
			for j, d := range docs {
				if err := g.add(d, unreadable[j]); err != nil {
					return err
				}
			}
		}
		if !more {
			return nil
		}
		r.After = streamOf(ids.at(ids.len() - 1))
	}
}

// grouper gathers commits arriving in log order into streams and hands
// each stream to fn once its last commit has arrived.
type grouper struct {
	fn  func(domain.StreamEvents) error
	cur domain.StreamEvents
}

// add takes the next commit in log order; unreadable is its decode error.
func (g *grouper) add(d commitDoc, unreadable error) error {
	if d.StreamID != g.cur.StreamID {
		if err := g.flush(); err != nil {
			return err
		}
		g.cur = domain.StreamEvents{StreamID: d.StreamID}
	}
	g.cur.Commits++
	switch {
	case g.cur.Err != nil:
		// The events after an unreadable commit are left out.
	case unreadable != nil:
		g.cur.Err = unreadable
	default:
		evs, err := d.events()
		if err != nil {
			g.cur.Err = err
			return nil
		}
		g.cur.Events = append(g.cur.Events, evs...)
	}
	return nil
}

// flush hands the stream gathered so far to fn.
func (g *grouper) flush() error {
	if g.cur.StreamID == "" {
		return nil
	}
	st := g.cur
	g.cur = domain.StreamEvents{}
	return g.fn(st)
}

const (
	scanBatch    = 512 // commits read per batch of a Scan
	scanParallel = 8   // _id look-ups of a batch in flight at once (scanByID)
)

// streamOf is the stream id of a commit id (see CommitID).
func streamOf(commitID string) string {
	if i := strings.LastIndexByte(commitID, ':'); i >= 0 {
		return commitID[:i]
	}
	return commitID
}

// commitsByID reads the commits ids, in the order given. A commit whose
// document does not decode is left with only its stream id, and its error
// (domain.ErrUnreadableCommit) is at its index in unreadable: it spoils
// its stream, not the scan.
func (s *EventStore) commitsByID(ctx context.Context, ids []string) (docs []commitDoc, unreadable []error, err error) {
	docs, unreadable = make([]commitDoc, len(ids)), make([]error, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(scanParallel)
	for i, id := range ids {
		g.Go(func() error {
			d, found, err := s.findCommit(gctx, "commit "+id, bson.D{{Key: "_id", Value: id}})
			switch {
			case errors.Is(err, domain.ErrUnreadableCommit):
				docs[i], unreadable[i] = d, err
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
