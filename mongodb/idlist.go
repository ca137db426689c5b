package mongodb

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// idList holds commit ids packed into 1 MiB chunks, about 50 bytes a
// commit against about 70 for a []string, and sorts them in place.
type idList struct {
	chunks [][]byte
	refs   []uint64 // chunk<<48 | offset<<16 | length, one per id
}

const idChunk = 1 << 20

func (l *idList) len() int { return len(l.refs) }

// id is the id a ref points at.
func (l *idList) id(r uint64) []byte {
	off := (r >> 16) & (1<<32 - 1)
	return l.chunks[r>>48][off : off+r&(1<<16-1)]
}

func (l *idList) at(i int) string { return string(l.id(l.refs[i])) }

func (l *idList) push(id string) error {
	if len(id) >= 1<<16 {
		return fmt.Errorf("commit id of %d bytes", len(id))
	}
	last := len(l.chunks) - 1
	if last < 0 || len(l.chunks[last])+len(id) > cap(l.chunks[last]) {
		l.chunks = append(l.chunks, make([]byte, 0, idChunk))
		last++
	}
	off := len(l.chunks[last])
	l.chunks[last] = append(l.chunks[last], id...)
	l.refs = append(l.refs, uint64(last)<<48|uint64(off)<<16|uint64(len(id)))
	return nil
}

// idBudget is how many commit ids one pass of scanByID holds: about
// 50 MiB. It bounds a scan's memory whatever the size of the log, at the
// price of a pass over the range's ids per budget's worth of commits.
const idBudget = 1 << 20

// commitIDs returns the ids of the commits matching filter in log order
// (bytewise, as MongoDB compares string _ids): all of them, or, when there
// are more than budget, the first budget and the rest of the stream of the
// last one, with more set. It holds about twice budget ids, three times
// for the moment it drops the ids beyond the first budget (and more when
// one stream has more commits than budget).
func (s *EventStore) commitIDs(ctx context.Context, filter bson.D, budget int) (ids *idList, more bool, err error) {
	ids = &idList{}
	limit := "" // ids from limit on are left for a later pass; "" for none
	full := 2 * budget
	var bad error
	err = s.eachID(ctx, filter, func(id string) {
		if limit != "" && id >= limit {
			return
		}
		if err := ids.push(id); err != nil && bad == nil {
			bad = fmt.Errorf("scan log ids: %w", err)
		}
		if ids.len() >= full {
			ids, limit = ids.firstStreams(budget)
			full = max(full, 2*ids.len()) // a stream longer than budget
		}
	})
	if err = cmp.Or(err, bad); err != nil {
		return nil, false, err
	}
	ids.sort()
	if ids.len() > budget {
		ids, limit = ids.firstStreams(budget)
	}
	return ids, limit != "", nil
}

func (l *idList) sort() {
	slices.SortFunc(l.refs, func(a, b uint64) int { return bytes.Compare(l.id(a), l.id(b)) })
}

// firstStreams returns the first n ids of l in log order and the rest of
// the stream of the last of them, packed anew, and the least id left out
// beyond them: the start of the next stream.
func (l *idList) firstStreams(n int) (*idList, string) {
	l.sort()
	limit := streamOf(l.at(n-1)) + ";"
	out := &idList{}
	for i := 0; i < l.len() && l.at(i) < limit; i++ {
		_ = out.push(l.at(i)) // fits: it fitted in l
	}
	return out, limit
}

// eachID calls fn with the id of each commit matching filter, unsorted.
func (s *EventStore) eachID(ctx context.Context, filter bson.D, fn func(string)) error {
	opts := options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(4096)
	return eachFound(ctx, s.commits, "scan log ids", filter, opts, func(cur *mongo.Cursor) error {
		id, ok := cur.Current.Lookup("_id").StringValueOK()
		if !ok {
			return fmt.Errorf("scan log ids: commit id %s is not a string", cur.Current.Lookup("_id"))
		}
		fn(id)
		return nil
	})
}
