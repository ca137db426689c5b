package projection

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/orderd/orderd/domain"
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
// once (keeping a hash of each document under a hash of its id), then
// scans the log, folding each stream; documents that differ are checked
// again on their own (a fresh fold and a fresh read, so a projector that
// merely moved on in between is not reported), and with repair rewritten
// (or deleted, for extra ones), each write only after the pointer was
// read again and still names coll. progress (nil: none) is called every
// 500 streams and at the end; its error stops the verify. Errors:
// domain.ErrPointerMoved (wrapped) when a repair finds coll no longer
// named by the pointer (the verify stops there, having written nothing
// more), progress's, the log's and the store's.
func (p *Model[D]) Verify(ctx context.Context, coll string, log Scanner, repair bool, progress func(VerifyProgress) error) (VerifyReport, error) {
	v, err := p.startVerify(ctx, coll)
	if err != nil {
		return v.rep, err
	}
	err = log.Scan(ctx, domain.ScanRange{}, func(st domain.StreamEvents) error {
		v.rep.Streams++
		v.rep.Events += int64(len(st.Events))
		doc, n, ferr := p.def.Fold(st.Events)
		if ferr != nil || st.Err != nil {
			v.rep.PoisonStreams++
		}
		// Documents whose ids share a hash share an entry: the streams
		// become suspects (the second finds none), and so do the
		// documents (below); the recheck reads each on its own.
		k := v.key(st.StreamID)
		got, ok := v.seen[k]
		delete(v.seen, k)
		if n > 0 {
			h, err := DocHash(doc)
			if err != nil {
				return err
			}
			v.expected.Add(h)
			if !ok || got != sumOf(h) {
				v.suspects = append(v.suspects, st.StreamID)
			}
		} else if ok {
			v.suspects = append(v.suspects, st.StreamID)
		}
		v.pr.Commits += int64(st.Commits)
		return v.step(st.StreamID, progress)
	})
	if err != nil {
		return v.rep, fmt.Errorf("verify %s: %w", coll, err)
	}
	// The suspects' fresh folds are not added to expected: the scan's are.
	return p.finishVerify(ctx, v, repair, nil, progress)
}

// VerifySums compares coll, a rebuild's shadow, with the sums its scan
// recorded in SumsCollection(coll), instead of folding the log again as
// Verify does: it reads the shadow once (keeping, as Verify, a hash of
// each document under a hash of its id, about 24 bytes a document), then
// the sums. A document is a suspect when it differs from its sum, when it
// is missing while a sum names it, or when it has no sum: live projectors
// write the shadow too (a document may be ahead of the scan's fold, or of
// a stream new since the scan), and a partition scanned by a binary that
// recorded no sums left none. Each suspect is checked again on its own,
// exactly as Verify's (a fresh read, a fresh fold of its stream from the
// log, and with repair a rewrite).
//
// Every event is in the scan or in coll (ApplyAll). What it cannot see is
// an event appended after the scan read its stream that has not reached
// coll yet: one a projector has yet to apply (it will, after the switch
// too), or one coll's fold refused while the active collection took it
// (ApplyAll acknowledges events on the active collection's outcome).
// Verify, which folds the log after the scan, sees those; here the
// document catches up at its stream's next event, whose gap is filled
// from the log, or at a verify job with repair. A stream whose document
// and sum are both missing is not seen either, so the caller uses Verify
// when a partition was scanned without recording sums.
//
// The report's Streams counts the recorded sums, Events the events their
// documents reflect (the sum of their versions), Documents the documents
// read; PoisonStreams is left to the caller, which counted the poison
// streams, and the events of streams that left no document, while
// scanning. ExpectedDigest is the digest of what the shadow should hold:
// the recorded fold of each document that matched its sum, and the fresh
// fold of each suspect; it equals Digest exactly when nothing drifted, as
// Verify's. progress (nil: none) is called every 500 sums and at the end,
// with Streams, Events and Cursor as read so far; its error stops the
// verify. Errors: as Verify's.
func (p *Model[D]) VerifySums(ctx context.Context, coll string, repair bool, progress func(VerifyProgress) error) (VerifyReport, error) {
	v, err := p.startVerify(ctx, coll)
	if err != nil {
		return v.rep, err
	}
	err = p.store.EachSum(ctx, coll, func(d Sum) error {
		v.rep.Streams++
		v.rep.Events += d.Version
		k := v.key(d.ID)
		got, ok := v.seen[k]
		delete(v.seen, k)
		// A document under a shared key is read again on its own (below),
		// which adds its fresh fold to expected: the recorded one is not
		// added too.
		if !ok || v.shared[k] || got != sumOf(d.Hash) {
			v.suspects = append(v.suspects, d.ID)
		} else {
			v.expected.Add(d.Hash)
		}
		return v.step(d.ID, progress)
	})
	if err != nil {
		return v.rep, fmt.Errorf("verify %s: %w", SumsCollection(coll), err)
	}
	return p.finishVerify(ctx, v, repair, &v.expected, progress)
}

// verifying is one Verify or VerifySums under way: the read model's
// documents not matched yet, the suspects found and the report so far. A
// rollup's VerifySums uses only its report and progress.
type verifying struct {
	coll     string
	rep      VerifyReport
	key      func(id string) docKey
	seen     map[docKey]docSum // documents not matched yet
	shared   map[docKey]bool   // keys of more than one document
	digest   Digest            // of every document read
	expected Digest
	suspects []string
	pr       VerifyProgress
}

// startVerify reads every document of coll once, keeping the half hash
// of each under the docKey of its id (seen), the keys shared by more than
// one document, and the digest of them all; it counts them in
// rep.Documents.
func (p *Model[D]) startVerify(ctx context.Context, coll string) (*verifying, error) {
	seed := maphash.MakeSeed()
	v := &verifying{coll: coll, rep: VerifyReport{Collection: coll, Examples: []DriftExample{}},
		key: func(id string) docKey { return idKey(seed, id) }, seen: map[docKey]docSum{}, shared: map[docKey]bool{}}
	err := p.store.Each(ctx, coll, func(id string, doc D) error {
		h, err := DocHash(doc)
		if err != nil {
			return err
		}
		v.digest.Add(h)
		k := v.key(id)
		if _, dup := v.seen[k]; dup {
			v.shared[k] = true
		}
		v.seen[k] = sumOf(h)
		v.rep.Documents++
		return nil
	})
	if err != nil {
		return v, fmt.Errorf("verify %s: %w", coll, err)
	}
	return v, nil
}

// step records the stream or sum just compared and calls progress every
// 500 of them.
func (v *verifying) step(cursor string, progress func(VerifyProgress) error) error {
	v.pr.Streams, v.pr.Events, v.pr.Cursor = v.rep.Streams, v.rep.Events, cursor
	if v.rep.Streams%500 == 0 && progress != nil {
		return progress(v.pr)
	}
	return nil
}

// finishVerify adds the documents left unmatched to the suspects, checks
// each suspect again on its own (recheck, adding its fresh fold to fresh
// unless nil), and calls progress a last time.
func (p *Model[D]) finishVerify(ctx context.Context, v *verifying, repair bool, fresh *Digest, progress func(VerifyProgress) error) (VerifyReport, error) {
	if len(v.seen) > 0 || len(v.shared) > 0 {
		// The documents left unmatched, whose key is still in seen or
		// shared with another document, read from the read model again.
		err := p.store.Each(ctx, v.coll, func(id string, _ D) error {
			if _, ok := v.seen[v.key(id)]; ok || v.shared[v.key(id)] {
				v.suspects = append(v.suspects, id)
			}
			return nil
		})
		if err != nil {
			return v.rep, fmt.Errorf("verify %s: %w", v.coll, err)
		}
	}
	suspects := slices.Compact(slices.Sorted(slices.Values(v.suspects)))
	for _, id := range suspects {
		if err := p.recheck(ctx, v.coll, id, repair, &v.rep, fresh); err != nil {
			return v.rep, err
		}
	}
	v.rep.Digest, v.rep.ExpectedDigest = v.digest.String(), v.expected.String()
	return v.end(progress)
}

// end calls progress (nil: none) a last time and returns the report.
func (v *verifying) end(progress func(VerifyProgress) error) (VerifyReport, error) {
	if progress != nil {
		if err := progress(v.pr); err != nil {
			return v.rep, err
		}
	}
	return v.rep, nil
}

// recheck compares one suspect document with a fresh fold of its stream,
// counts it if it still differs, and repairs it if asked. expected (nil:
// none) gets the hash of the fresh fold, when the stream has one.
func (p *Model[D]) recheck(ctx context.Context, coll, id string, repair bool, rep *VerifyReport, expected *Digest) error {
	d, err := p.compare(ctx, coll, id)
	if err != nil {
		return fmt.Errorf("verify %s: %w", coll, err)
	}
	if expected != nil && d.events > 0 {
		h, err := DocHash(d.want)
		if err != nil {
			return err
		}
		expected.Add(h)
	}
	if d.Kind == "" {
		return nil
	}
	rep.add(d.DriftExample)
	if !repair {
		return nil
	}
	if err := p.named(ctx, coll); err != nil {
		return err
	}
	s := p.ReadModel(coll)
	s.cache.Remove(id)
	if d.Kind == "extra" {
		if err := p.store.Delete(ctx, coll, id); err != nil {
			return fmt.Errorf("repair %s: delete %s: %w", coll, id, err)
		}
	} else if err := p.overwrite(ctx, s, id, d.want, d.StoredVersion, d.exists); err != nil {
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
func (p *Model[D]) named(ctx context.Context, coll string) error {
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
func (p *Model[D]) overwrite(ctx context.Context, s *ReadModel[D], id string, doc D, stored int64, exists bool) error {
	if err := p.store.Overwrite(ctx, s.coll, id, doc, stored, exists); err != nil {
		return fmt.Errorf("repair %s: write %s: %w", s.coll, id, err)
	}
	evs, err := p.log.LoadFrom(ctx, id, p.def.StreamVersion(&doc)+1)
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
