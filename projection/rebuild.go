package projection

import (
	"cmp"
	"context"
	"fmt"

	"github.com/orderd/orderd/domain"
)

// What a rebuild and a verify (package jobs) exchange with a projection
// (Model: WriteFolds, VerifySums, Verify).

// SumsCollection is the collection in which a rebuild's scan records, for
// each document it writes into shadow (Model.WriteFolds), the
// document's version and hash: one document per stream. The rebuild's
// finish checks the shadow against them (the adapter's VerifySums) instead
// of folding the whole log a second time. It belongs to the shadow's
// rebuild, which retires it with the shadow or drops it after its switch.
func SumsCollection(shadow string) string { return shadow + "_sums" }

// FoldResult counts what writing a rebuild's batch of folded streams did.
type FoldResult struct {
	Events int64
	Poison int64    // streams with an event that could not be read or applied
	Errors []string // the first few poison errors
}

// fold counts a stream of events folded, and err, if not nil, as its
// poison (the first five errors are kept).
func (r *FoldResult) fold(st domain.StreamEvents, err error) {
	r.Events += int64(len(st.Events))
	if err = cmp.Or(err, st.Err); err != nil {
		r.Poison++
		if len(r.Errors) < 5 {
			r.Errors = append(r.Errors, err.Error())
		}
	}
}

// VerifyProgress is reported while a verify runs: streams, events and
// commits of the log read so far, and the last stream read (its id).
type VerifyProgress struct {
	Streams, Events, Commits int64
	Cursor                   string
}

// Scanner reads the event log stream by stream in log order (the events
// of each stream of r, in version order), as a verify folds it; the event
// store (package mongodb's EventStore) implements it. It returns fn's
// error, or the store's (domain.ErrUnavailable).
type Scanner interface {
	Scan(ctx context.Context, r domain.ScanRange, fn func(domain.StreamEvents) error) error
}

// WriteFolds folds each stream of a rebuild's batch and writes its
// document into coll: one unordered insert of the batch, and, for the
// documents a live projector has already written, the version-guarded
// write, so neither side can go back a version. It then records each
// document's version and hash in SumsCollection(coll), for the rebuild's
// finish (VerifySums). A stream that cannot be folded (or read:
// StreamEvents.Err) is counted as poison and its good events are kept.
// Errors: the store's (domain.ErrUnavailable).
func (p *Model[D]) WriteFolds(ctx context.Context, coll string, streams []domain.StreamEvents) (FoldResult, error) {
	var res FoldResult
	var docs []Doc[D]
	for _, st := range streams {
		doc, n, err := p.def.Fold(st.Events)
		res.fold(st, err)
		if n > 0 {
			docs = append(docs, Doc[D]{ID: st.StreamID, Doc: doc})
		}
	}
	if len(docs) == 0 {
		return res, nil
	}
	taken, err := p.store.Insert(ctx, coll, docs)
	if err != nil {
		return res, fmt.Errorf("%s: insert into %s: %w", p.def.Name, coll, err)
	}
	if len(taken) > 0 {
		// Some documents exist: live writes got there first. They go
		// through the version guard, which leaves a document a live
		// projector already holds at or past the fold as it is.
		var again []Doc[D]
		for i := range taken {
			again = append(again, docs[i])
		}
		if _, err := p.ReadModel(coll).save(ctx, again); err != nil {
			return res, err
		}
	}
	// After the documents: a batch whose sums fail is not checkpointed,
	// and its scan writes it again, documents and sums.
	sums := make([]Sum, len(docs))
	for i, d := range docs {
		h, err := DocHash(d.Doc)
		if err != nil {
			return res, fmt.Errorf("%s: hash %s: %w", p.def.Name, d.ID, err)
		}
		sums[i] = Sum{ID: d.ID, Version: p.def.StreamVersion(&d.Doc), Hash: h}
	}
	if err := p.store.SaveSums(ctx, coll, sums); err != nil {
		return res, fmt.Errorf("%s: record sums in %s: %w", p.def.Name, SumsCollection(coll), err)
	}
	return res, nil
}
