package projections

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"reflect"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// Scanner reads the event log stream by stream in log order (the events
// of each stream of r, in version order); eventstore.Store implements it.
type Scanner interface {
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
}

// EnsureCollectionIndexes creates the projection's indexes on collection
// coll, such as a rebuild's shadow before it is written. Errors:
// domain.ErrUnavailable.
func (p *Projection[D]) EnsureCollectionIndexes(ctx context.Context, coll string) error {
	return p.Store(coll).EnsureIndexes(ctx)
}

// fold folds a stream's events from nothing. It returns the document, the
// number of events applied and the error of the first event that could
// not be applied (the document then reflects the events before it, as the
// live projection leaves it).
func (p *Projection[D]) fold(evs []domain.Event) (D, int, error) {
	var doc D
	for i, e := range evs {
		if err := p.def.Apply(&doc, e); err != nil {
			return doc, i, fmt.Errorf("apply %s v%d of %s: %w", e.Type, e.Version, e.StreamID, err)
		}
	}
	return doc, len(evs), nil
}

// FoldResult counts what WriteFolds did.
type FoldResult struct {
	Events  int64
	Poison  int64    // streams with an event that could not be read or applied
	Errors  []string // the first few poison errors
	Guarded int64    // documents of a batch whose insert met existing ones, applied through the version guard
}

// WriteFolds folds each stream of a rebuild's batch and writes its
// document into coll: an insert, or, for a document a live projector has
// already written, the version-guarded write, so neither side can go back
// a version. A stream that cannot be folded (or read: StreamEvents.Err)
// is counted as poison and its good events are kept. Errors: the store's
// (domain.ErrUnavailable).
func (p *Projection[D]) WriteFolds(ctx context.Context, coll string, streams []domain.StreamEvents) (FoldResult, error) {
	s := p.Store(coll)
	var res FoldResult
	type folded struct {
		id   string
		evs  []domain.Event
		body bson.D
	}
	var docs []folded
	for _, st := range streams {
		res.Events += int64(len(st.Events))
		doc, n, err := p.fold(st.Events)
		if err == nil {
			err = st.Err
		}
		if err != nil {
			res.Poison++
			if len(res.Errors) < 5 {
				res.Errors = append(res.Errors, err.Error())
			}
		}
		if n == 0 {
			continue
		}
		body, err := storedBSON(st.StreamID, doc, p.def.Version(&doc))
		if err != nil {
			return res, fmt.Errorf("%s: encode %s: %w", p.def.Name, st.StreamID, err)
		}
		docs = append(docs, folded{id: st.StreamID, evs: st.Events[:n], body: body})
	}
	if len(docs) == 0 {
		return res, nil
	}
	all := make([]any, len(docs))
	for i, d := range docs {
		all[i] = d.body
	}
	if _, err := s.coll.InsertMany(ctx, all); err == nil {
		return res, nil
	} else if !isDuplicates(err) {
		return res, fmt.Errorf("%s: insert into %s: %w", p.def.Name, coll, mongoerr.Translate(err))
	}
	// Some documents exist (live writes got there first), and which of
	// the others this insert wrote is not reliable to tell (FerretDB stops
	// a bulk at the first error and reports it at the wrong index). So
	// each document goes through the version guard, which reads it and
	// writes only when it is missing or behind the fold: one a live
	// projector already holds at or past the fold costs a read, not a
	// write. Under load that is what keeps this fast: every write waits
	// for the store's writers (on the embedded store, one at a time behind
	// its funnel), and the documents that collide are the ones live
	// writes keep up to date.
	res.Guarded = int64(len(docs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for _, d := range docs {
		g.Go(func() error {
			_, _, err := s.applyStream(gctx, d.id, slices.Clone(d.evs), true)
			return err
		})
	}
	return res, g.Wait()
}

func isDuplicates(err error) bool {
	return mongo.IsDuplicateKeyError(err)
}

// storedBSON is the stored form of doc: {_id, attempted, fields...}.
func storedBSON[D any](id string, doc D, version int64) (bson.D, error) {
	raw, err := marshalJSONTags(doc)
	if err != nil {
		return nil, err
	}
	elems, err := raw.Elements()
	if err != nil {
		return nil, err
	}
	out := bson.D{{Key: "_id", Value: id}, {Key: "attempted", Value: version}}
	for _, el := range elems {
		if k := el.Key(); k != "_id" && k != "attempted" {
			out = append(out, bson.E{Key: k, Value: el.Value()})
		}
	}
	return out, nil
}

// examplesPerKind bounds the examples of each kind in a report.
const examplesPerKind = 5

// VerifyProgress is reported while a verify runs.
type VerifyProgress struct {
	Streams, Events, Commits int64
	Cursor                   string
}

// adhash is an AdHash digest: a sum of SHA-256 values modulo 2^256.
type adhash [4]uint64

func (a *adhash) add(h [32]byte) {
	var carry uint64
	for i := 3; i >= 0; i-- {
		a[i], carry = bits.Add64(a[i], binary.BigEndian.Uint64(h[i*8:]), carry)
	}
}

func (a adhash) String() string {
	var b [32]byte
	for i := range a {
		binary.BigEndian.PutUint64(b[i*8:], a[i])
	}
	return hex.EncodeToString(b[:])
}

// docHash is the SHA-256 of a document's JSON (encoding/json: struct
// fields in order, map keys sorted).
func docHash[D any](doc D) ([32]byte, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

type seenDoc struct {
	version int64
	hash    [32]byte
}

// Verify compares coll with the fold of the log. It reads the read model
// once (keeping each document's version and hash), then scans the log,
// folding each stream; documents that differ are checked again on their
// own (a fresh fold and a fresh read, so a projector that merely moved on
// in between is not reported), and with repair rewritten (or deleted, for
// extra ones) through the version guard, each write only after the
// pointer was read again and still names coll. progress (nil: none) is
// called every 500 streams and at the end; its error stops the verify.
// Errors: domain.ErrPointerMoved (wrapped) when a repair finds coll no
// longer named by the pointer (the verify stops there, having written
// nothing more), progress's, the log's and the store's.
func (p *Projection[D]) Verify(ctx context.Context, coll string, log Scanner, repair bool, progress func(VerifyProgress) error) (domain.VerifyReport, error) {
	s := p.Store(coll)
	rep := domain.VerifyReport{Collection: coll, Examples: []domain.DriftExample{}}
	seen := map[string]seenDoc{}
	var digest, expected adhash
	cur, err := s.coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1000))
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", coll, mongoerr.Translate(err))
	}
	for cur.Next(ctx) {
		var d stored[D]
		if err := cur.Decode(&d); err != nil {
			_ = cur.Close(ctx)
			return rep, fmt.Errorf("verify %s: decode: %w", coll, err)
		}
		h, err := docHash(d.Doc)
		if err != nil {
			_ = cur.Close(ctx)
			return rep, err
		}
		digest.add(h)
		seen[d.ID] = seenDoc{version: p.def.Version(&d.Doc), hash: h}
	}
	err = cur.Err()
	_ = cur.Close(ctx)
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", coll, mongoerr.Translate(err))
	}
	rep.Documents = int64(len(seen))

	var suspects []string
	var pr VerifyProgress
	err = log.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
		rep.Streams++
		rep.Events += int64(len(st.Events))
		doc, n, ferr := p.fold(st.Events)
		if ferr != nil || st.Err != nil {
			rep.PoisonStreams++
		}
		got, ok := seen[st.StreamID]
		delete(seen, st.StreamID)
		if n > 0 {
			h, err := docHash(doc)
			if err != nil {
				return err
			}
			expected.add(h)
			if !ok || got.hash != h {
				suspects = append(suspects, st.StreamID)
			}
		} else if ok {
			suspects = append(suspects, st.StreamID)
		}
		pr.Streams, pr.Events, pr.Cursor = rep.Streams, rep.Events, st.StreamID
		if rep.Streams%500 == 0 && progress != nil {
			return progress(pr)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", coll, err)
	}
	suspects = append(suspects, slices.Sorted(maps.Keys(seen))...)
	rep.Digest, rep.ExpectedDigest = digest.String(), expected.String()

	for _, id := range suspects {
		if err := p.recheck(ctx, s, id, repair, &rep); err != nil {
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

// recheck compares one suspect document with a fresh fold of its stream,
// counts it if it still differs, and repairs it if asked.
func (p *Projection[D]) recheck(ctx context.Context, s *Store[D], id string, repair bool, rep *domain.VerifyReport) error {
	// The document first, then the log: a document only reflects events
	// already in the log, so a live write in between cannot look like a
	// document ahead of the log.
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	exists := err == nil
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("verify %s: read %s: %w", s.def.Collection, id, mongoerr.Translate(err))
	}
	evs, err := s.log.LoadFrom(ctx, id, 1)
	if err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	want, n, _ := p.fold(evs)
	ex := domain.DriftExample{ID: id, LogVersion: p.def.Version(&want), StoredVersion: p.def.Version(&d.Doc)}
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
		ex.Kind, ex.Fields = "stale", diffFields(d.Doc, want)
		rep.Stale++
	default:
		ex.Fields = diffFields(d.Doc, want)
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
			return fmt.Errorf("repair %s: delete %s: %w", s.def.Collection, id, mongoerr.Translate(err))
		}
		s.cache.Remove(id)
	} else if err := s.overwrite(ctx, id, want); err != nil {
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

// diffFields lists the top-level JSON fields in which a and b differ.
func diffFields[D any](a, b D) []string {
	var ma, mb map[string]any
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	_ = json.Unmarshal(ja, &ma)
	_ = json.Unmarshal(jb, &mb)
	var out []string
	for k := range ma {
		if !reflect.DeepEqual(ma[k], mb[k]) {
			out = append(out, k)
		}
	}
	for k := range mb {
		if _, ok := ma[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// overwrite sets a document to doc, a fold of the log, whatever version
// and attempted register it holds (a corrupted register would otherwise
// hold the document back for ever). A live write that landed just before
// it is not lost: the log is read again afterwards and the document
// brought up to the head through the version guard.
func (s *Store[D]) overwrite(ctx context.Context, id string, doc D) error {
	if _, err := s.writeDoc(ctx, id, doc, "$set"); err != nil {
		return err
	}
	evs, err := s.log.LoadFrom(ctx, id, s.def.Version(&doc)+1)
	if err != nil {
		return fmt.Errorf("repair %s: %w", id, err)
	}
	if len(evs) > 0 {
		if _, _, err := s.applyStream(ctx, id, evs, true); err != nil {
			return err
		}
	}
	return nil
}
