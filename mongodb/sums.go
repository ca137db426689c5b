package mongodb

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
)

// sumDoc is what a rebuild's scan recorded of one document it wrote.
type sumDoc struct {
	ID      string `bson:"_id"`
	Version int64  `bson:"version"` // the document's stream version, as the read model stores it
	// Hash is the projection.DocHash of the folded document, all 32
	// bytes: the verify keeps half of it per document in memory, and
	// adds the whole to the expected digest.
	Hash []byte `bson:"hash"`
}

// recordSums records in sums the version and hash of each document of a
// rebuild's batch: one unordered insert. A stream already recorded (a
// scan retried from its cursor writes the streams after it again, or a
// deposed owner's late batch did) is a duplicate key; only those
// documents are then replaced, by _id. Errors: the store's
// (domain.ErrUnavailable).
func (p *Projection[D]) recordSums(ctx context.Context, sums string, docs []folded[D]) error {
	all := make([]sumDoc, len(docs))
	body := make([]any, len(docs))
	for i, d := range docs {
		h, err := projection.DocHash(d.doc)
		if err != nil {
			return fmt.Errorf("%s: hash %s: %w", p.def.Name, d.id, err)
		}
		all[i] = sumDoc{ID: d.id, Version: p.def.StreamVersion(&d.doc), Hash: h[:]}
		body[i] = all[i]
	}
	coll := p.db.Collection(sums)
	_, err := coll.InsertMany(ctx, body, options.InsertMany().SetOrdered(false))
	if err == nil {
		return nil
	}
	met, err := splitSuperseded(err)
	if err != nil {
		return fmt.Errorf("%s: record sums in %s: %w", p.def.Name, sums, Translate(err))
	}
	for i := range met {
		if _, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: all[i].ID}}, all[i], options.Replace().SetUpsert(true)); err != nil {
			return fmt.Errorf("%s: record the sum of %s in %s: %w", p.def.Name, all[i].ID, sums, Translate(err))
		}
	}
	return nil
}

// DropSums drops the projection.SumsCollection of shadow, which the rebuild's finish
// no longer needs once it has verified and switched. Dropping a
// collection that does not exist is no error. Errors: domain.ErrUnavailable.
func (p *Projection[D]) DropSums(ctx context.Context, shadow string) error {
	if err := p.db.Collection(projection.SumsCollection(shadow)).Drop(ctx); err != nil {
		return fmt.Errorf("drop %s: %w", projection.SumsCollection(shadow), Translate(err))
	}
	return nil
}

// VerifySums compares coll, a rebuild's shadow, with the sums its scan
// recorded in projection.SumsCollection(coll), instead of folding the log again as
// Verify does: it reads the shadow once (keeping, as Verify, a hash of
// each document under a hash of its id, about 24 bytes a document), then
// the sums. A document is a suspect when it differs from its sum, when it
// is missing while a sum names it, or when it has no sum: live projectors
// write the shadow too (a document may be ahead of the scan's fold, or of
// a stream new since the scan), and a partition scanned by a binary that
// recorded no sums left none. Each suspect is checked again on its own,
// exactly as Verify's (a fresh read, a fresh fold of its stream from the
// log, and with repair a rewrite through the version guard).
//
// Every event is in the scan or in coll: a projector batch writes a
// shadow announced while it ran before its events are acknowledged
// (Projection.Apply). What it cannot see is an event appended after the
// scan read its stream that has not reached coll yet: one a projector has
// yet to apply (it will, after the switch too), or one coll's fold
// refused while the active collection took it (Projection.Apply
// acknowledges events on the active collection's outcome). Verify, which
// folds the log after the scan, sees those; here the document catches up
// at its stream's next event, whose gap is filled from the log, or at a
// verify job with repair. A stream whose document
// and sum are both missing is not seen either, so the caller uses Verify
// when a partition was scanned without recording sums.
//
// The report's Streams counts the recorded sums, Events the events their
// documents reflect (the sum of their versions), Documents the documents
// read; PoisonStreams is left to the caller, which counted the poison
// streams, and the events of streams that left no document, while
// scanning. ExpectedDigest is the digest of what the shadow
// should hold: the recorded fold of each document that matched its sum,
// and the fresh fold of each suspect; it equals Digest exactly when
// nothing drifted, as Verify's. progress (nil: none) is called every 500
// sums and at the end, with Streams, Events and Cursor as read so far; its
// error stops the verify. Errors: as Verify's.
func (p *Projection[D]) VerifySums(ctx context.Context, coll string, repair bool, progress func(projection.VerifyProgress) error) (jobs.VerifyReport, error) {
	s := p.ReadModel(coll)
	rep := jobs.VerifyReport{Collection: coll, Examples: []jobs.DriftExample{}}
	seed := maphash.MakeSeed()
	key := func(id string) docKey { return idKey(seed, id) }
	seen, shared, digest, err := p.readHashes(ctx, s, key, &rep)
	if err != nil {
		return rep, err
	}
	sums := projection.SumsCollection(coll)
	cur, err := p.db.Collection(sums).Find(ctx, bson.D{}, options.Find().SetBatchSize(1000))
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", sums, Translate(err))
	}
	var expected projection.Digest
	var suspects []string
	var pr projection.VerifyProgress
	for cur.Next(ctx) {
		var d sumDoc
		if err := cur.Decode(&d); err != nil {
			_ = cur.Close(ctx)
			return rep, fmt.Errorf("verify %s: decode: %w", sums, err)
		}
		rep.Streams++
		rep.Events += d.Version
		k := key(d.ID)
		got, ok := seen[k]
		delete(seen, k)
		var h [32]byte
		// A document under a shared key is read again on its own (below),
		// which adds its fresh fold to expected: the recorded one is not
		// added too.
		if len(d.Hash) != len(h) || !ok || shared[k] || got != sumOf([32]byte(d.Hash)) {
			suspects = append(suspects, d.ID)
		} else {
			expected.Add([32]byte(d.Hash))
		}
		pr.Streams, pr.Events, pr.Cursor = rep.Streams, rep.Events, d.ID
		if rep.Streams%500 == 0 && progress != nil {
			if err := progress(pr); err != nil {
				_ = cur.Close(ctx)
				return rep, err
			}
		}
	}
	err = cur.Err()
	_ = cur.Close(ctx)
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", sums, Translate(err))
	}
	// Documents with no sum.
	extra, err := s.leftovers(ctx, seen, shared, key)
	if err != nil {
		return rep, err
	}
	suspects = append(suspects, extra...)
	slices.Sort(suspects)
	suspects = slices.Compact(suspects)
	for _, id := range suspects {
		if err := p.recheck(ctx, s, id, repair, &rep, &expected); err != nil {
			return rep, err
		}
	}
	rep.Digest, rep.ExpectedDigest = digest.String(), expected.String()
	if progress != nil {
		if err := progress(pr); err != nil {
			return rep, err
		}
	}
	return rep, nil
}
