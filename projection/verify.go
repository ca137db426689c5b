package projection

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

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore/mongoerr"
)

// Scanner reads the event log stream by stream in log order (the events
// of each stream of r, in version order); eventstore.Store implements it.
type Scanner interface {
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
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
	s := p.ReadModel(coll)
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
func (p *Projection[D]) recheck(ctx context.Context, s *ReadModel[D], id string, repair bool, rep *domain.VerifyReport) error {
	// The document first, then the log: a document only reflects events
	// already in the log, so a live write in between cannot look like a
	// document ahead of the log.
	var d stored[D]
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	exists := err == nil
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return fmt.Errorf("verify %s: read %s: %w", s.def.Collection, id, mongoerr.Translate(err))
	}
	evs, err := s.events.LoadFrom(ctx, id, 1)
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
func (s *ReadModel[D]) overwrite(ctx context.Context, id string, doc D) error {
	if _, err := s.writeDoc(ctx, id, doc, "$set"); err != nil {
		return err
	}
	evs, err := s.events.LoadFrom(ctx, id, s.def.Version(&doc)+1)
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
