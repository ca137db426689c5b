package mongodb

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
)

// examplesPerKind bounds the examples of each kind in a report.
const examplesPerKind = 5

// docKey is what a verify keeps of each read-model document while it
// scans the log: 8 bytes of its id's hash, so the memory does not hold the
// ids themselves (about 24 bytes a document in the map, against about 110
// with the id and the whole hash).
type docKey uint64

// docSum is the first half of a document's SHA-256.
type docSum [16]byte

func sumOf(h [32]byte) docSum { return docSum(h[:16]) }

// idKey is the docKey of a document id (a variable for the test that
// makes every id collide).
var idKey = func(seed maphash.Seed, id string) docKey { return docKey(maphash.String(seed, id)) }

// Verify compares coll with the fold of the log. It reads the read model
// once (keeping a hash of each document under a hash of its id), then scans the log,
// folding each stream; documents that differ are checked again on their
// own (a fresh fold and a fresh read, so a projector that merely moved on
// in between is not reported), and with repair rewritten (or deleted, for
// extra ones) through the version guard, each write only after the
// pointer was read again and still names coll. progress (nil: none) is
// called every 500 streams and at the end; its error stops the verify.
// Errors: domain.ErrPointerMoved (wrapped) when a repair finds coll no
// longer named by the pointer (the verify stops there, having written
// nothing more), progress's, the log's and the store's.
func (p *Projection[D]) Verify(ctx context.Context, coll string, log projection.Scanner, repair bool, progress func(projection.VerifyProgress) error) (jobs.VerifyReport, error) {
	s := p.ReadModel(coll)
	rep := jobs.VerifyReport{Collection: coll, Examples: []jobs.DriftExample{}}
	seed := maphash.MakeSeed()
	key := func(id string) docKey { return idKey(seed, id) }
	seen, shared, digest, err := p.readHashes(ctx, s, key, &rep)
	if err != nil {
		return rep, err
	}
	var expected projection.Digest
	var suspects []string
	var pr projection.VerifyProgress
	err = log.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
		rep.Streams++
		rep.Events += int64(len(st.Events))
		doc, n, ferr := p.def.Fold(st.Events)
		if ferr != nil || st.Err != nil {
			rep.PoisonStreams++
		}
		// Documents whose ids share a hash share an entry: the streams
		// become suspects (the second finds none), and so do the
		// documents (below); the recheck reads each on its own.
		k := key(st.StreamID)
		got, ok := seen[k]
		delete(seen, k)
		if n > 0 {
			h, err := projection.DocHash(doc)
			if err != nil {
				return err
			}
			expected.Add(h)
			if !ok || got != sumOf(h) {
				suspects = append(suspects, st.StreamID)
			}
		} else if ok {
			suspects = append(suspects, st.StreamID)
		}
		pr.Streams, pr.Events, pr.Cursor = rep.Streams, rep.Events, st.StreamID
		pr.Commits += int64(st.Commits)
		if rep.Streams%500 == 0 && progress != nil {
			return progress(pr)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", coll, err)
	}
	// Documents of no stream in the log.
	extra, err := s.leftovers(ctx, seen, shared, key)
	if err != nil {
		return rep, err
	}
	suspects = append(suspects, extra...)
	slices.Sort(suspects)
	suspects = slices.Compact(suspects)
	rep.Digest, rep.ExpectedDigest = digest.String(), expected.String()

	for _, id := range suspects {
		if err := p.recheck(ctx, s, id, repair, &rep, nil); err != nil {
			return rep, err
		}
	}
	if progress != nil {
		if err := progress(pr); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// readHashes reads every document of s once and returns the half hash of
// each under the docKey of its id, the keys shared by more than one
// document, and the digest of them all; it counts them in rep.Documents.
func (p *Projection[D]) readHashes(ctx context.Context, s *ReadModel[D], key func(string) docKey, rep *jobs.VerifyReport) (map[docKey]docSum, map[docKey]bool, projection.Digest, error) {
	seen := map[docKey]docSum{}
	shared := map[docKey]bool{} // keys of more than one document
	var digest projection.Digest
	cur, err := s.coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1000))
	if err != nil {
		return nil, nil, digest, fmt.Errorf("verify %s: %w", s.def.Collection, Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		var d stored[D]
		if err := cur.Decode(&d); err != nil {
			return nil, nil, digest, fmt.Errorf("verify %s: decode: %w", s.def.Collection, err)
		}
		h, err := projection.DocHash(d.Doc)
		if err != nil {
			return nil, nil, digest, err
		}
		digest.Add(h)
		k := key(d.ID)
		if _, dup := seen[k]; dup {
			shared[k] = true
		}
		seen[k] = sumOf(h)
		rep.Documents++
	}
	if err := cur.Err(); err != nil {
		return nil, nil, digest, fmt.Errorf("verify %s: %w", s.def.Collection, Translate(err))
	}
	return seen, shared, digest, nil
}

// leftovers returns the ids of the documents a verify left unmatched: those
// whose key is still in seen, or shared with another document, read from
// the read model again (nil when there are none).
func (s *ReadModel[D]) leftovers(ctx context.Context, seen map[docKey]docSum, shared map[docKey]bool, key func(string) docKey) ([]string, error) {
	if len(seen) == 0 && len(shared) == 0 {
		return nil, nil
	}
	return s.idsOf(ctx, func(id string) bool {
		_, ok := seen[key(id)]
		return ok || shared[key(id)]
	})
}

// idsOf returns the sorted ids of the documents for which keep is true.
func (s *ReadModel[D]) idsOf(ctx context.Context, keep func(id string) bool) ([]string, error) {
	cur, err := s.coll.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(1000))
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", s.def.Collection, Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var ids []string
	for cur.Next(ctx) {
		id, ok := cur.Current.Lookup("_id").StringValueOK()
		if ok && keep(id) {
			ids = append(ids, id)
		}
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("verify %s: %w", s.def.Collection, Translate(err))
	}
	slices.Sort(ids)
	return ids, nil
}

// recheck compares one suspect document with a fresh fold of its stream,
// counts it if it still differs, and repairs it if asked. expected (nil:
// none) gets the hash of the fresh fold, when the stream has one.
func (p *Projection[D]) recheck(ctx context.Context, s *ReadModel[D], id string, repair bool, rep *jobs.VerifyReport, expected *projection.Digest) error {
	// The document first, then the log: a document only reflects events
	// already in the log, so a live write in between cannot look like a
	// document ahead of the log.
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	exists := err == nil
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("verify %s: read %s: %w", s.def.Collection, id, Translate(err))
	}
	evs, err := s.events.LoadFrom(ctx, id, 1)
	if err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	want, n, _ := p.def.Fold(evs)
	if expected != nil && n > 0 {
		h, err := projection.DocHash(want)
		if err != nil {
			return err
		}
		expected.Add(h)
	}
	ex := jobs.DriftExample{ID: id, LogVersion: p.def.StreamVersion(&want), StoredVersion: p.def.StreamVersion(&d.Doc)}
	switch {
	case n == 0 && !exists:
		return nil
	case n == 0:
		ex.Kind, ex.LogVersion = "extra", 0
		rep.Extra++
	case !exists:
		ex.Kind, ex.StoredVersion = "missing", 0
		rep.Missing++
	case ex.StoredVersion < ex.LogVersion:
		ex.Kind, ex.Fields = "stale", projection.DiffFields(d.Doc, want)
		rep.Stale++
	default:
		ex.Fields = projection.DiffFields(d.Doc, want)
		if len(ex.Fields) == 0 {
			return nil
		}
		ex.Kind = "different"
		rep.Different++
	}
	kinds := 0
	for _, e := range rep.Examples {
		if e.Kind == ex.Kind {
			kinds++
		}
	}
	if kinds < examplesPerKind {
		rep.Examples = append(rep.Examples, ex)
	}
	if !repair {
		return nil
	}
	if err := p.named(ctx, s.def.Collection); err != nil {
		return err
	}
	if ex.Kind == "extra" {
		if _, err := s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
			return fmt.Errorf("repair %s: delete %s: %w", s.def.Collection, id, Translate(err))
		}
		s.cache.Remove(id)
	} else if err := s.overwrite(ctx, id, want, ex.StoredVersion, exists); err != nil {
		return err
	}
	rep.Repaired++
	return nil
}

// named returns nil while the projection's pointer, read from the store,
// names coll as its active or shadow collection. Repair writes are
// upserts: one into a collection a rebuild has replaced (or withdrawn)
// and the drop that follows has removed would create it again, out of
// every pointer's sight, and nothing would ever drop it. A collection
// leaves the pointer at least the grace period before it is dropped, so
// a write right after this check lands before the drop. Errors:
// domain.ErrPointerMoved (wrapped) when the pointer no longer names coll,
// domain.ErrUnavailable.
func (p *Projection[D]) named(ctx context.Context, coll string) error {
	ptr, err := p.Pointer(ctx, 0)
	if err != nil {
		return fmt.Errorf("repair %s: %w", coll, err)
	}
	if ptr.Active != coll && ptr.Shadow != coll {
		return fmt.Errorf("repair %s: the pointer of %s at generation %d names %q active and %q shadow: %w",
			coll, p.def.Name, ptr.Generation, ptr.Active, ptr.Shadow, domain.ErrPointerMoved)
	}
	return nil
}

// overwrite sets a document to doc, a fold of the log, whatever version it
// holds (a corrupted version would otherwise hold it back for ever): the
// one write that may lower a version, and only as a compare-and-set on the
// version the verify read (stored, with exists false for no document). A
// live write that lands in between makes it match nothing and stays. The
// log is then read again and the document brought up to the head through
// the version guard.
func (s *ReadModel[D]) overwrite(ctx context.Context, id string, doc D, stored int64, exists bool) error {
	body, err := storedBSON(id, doc)
	if err != nil {
		return fmt.Errorf("repair %s: encode %s: %w", s.def.Collection, id, err)
	}
	s.cache.Remove(id)
	if exists {
		filter := bson.D{{Key: "_id", Value: id}, {Key: "version", Value: bson.D{{Key: "$eq", Value: stored}}}}
		_, err = s.coll.ReplaceOne(ctx, filter, body)
	} else if _, err = s.coll.InsertOne(ctx, body); mongo.IsDuplicateKeyError(err) {
		err = nil // a live write created it meanwhile
	}
	if err != nil {
		return fmt.Errorf("repair %s: write %s: %w", s.def.Collection, id, Translate(err))
	}
	evs, err := s.events.LoadFrom(ctx, id, s.def.StreamVersion(&doc)+1)
	if err != nil {
		return fmt.Errorf("repair %s: %w", id, err)
	}
	if len(evs) > 0 {
		if _, _, err := s.apply(ctx, evs, true); err != nil {
			return err
		}
	}
	return nil
}
