package mongodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// MaxAppendBatch is the most commits one group insert holds [100]: as
// many as FerretDB 1.24 writes in one SQLite statement (its insert batch
// size), far below MongoDB's maxWriteBatchSize (100,000), and enough that
// a burst of commands rarely needs a second round.
const MaxAppendBatch = 100

// appendWriteTimeout bounds a group insert [20s]. The insert runs for
// every command of its batch, so it cannot stop when the command that
// happens to write it gives up (context.WithoutCancel); it must still end.
// The bound lets the driver's retryable write wait out an election
// (ServerSelectionTimeout, 15 s) and leaves the insert itself 5 s; a
// command whose batch outlives it gets domain.ErrUnavailable.
const appendWriteTimeout = ServerSelectionTimeout + 5*time.Second

// group gathers the appends that arrive while an insert is in flight, for
// group commit (see EventStore). Its invariant: queue is empty unless writing.
type group struct {
	mu      sync.Mutex
	writing bool             // an insert is in flight, or about to be
	queue   []*pendingAppend // in arrival order, none yet in a batch
}

// pendingAppend is one Append on its way into a group insert.
type pendingAppend struct {
	doc    commitDoc
	queued bool             // in group.queue: a cancelled context still removes it
	batch  []*pendingAppend // set when it is to write this batch (it is batch[0])
	err    error            // the insert's outcome for doc, a driver error
	done   chan struct{}    // closed once it leads a batch or err is set
}

// join returns when p is to write a batch (p.batch is set) or its batch
// has been written (p.err is its outcome). An append that finds no insert
// in flight writes at once; one that arrives meanwhile queues. A context
// that ends while p is queued takes it out (nothing of it is written) and
// join returns ctx's error; once p is in a batch, join waits for the
// outcome, which the caller must learn.
func (g *group) join(ctx context.Context, p *pendingAppend) error {
	if err := ctx.Err(); err != nil {
		return err // the insert would outlive it: do not start one
	}
	g.mu.Lock()
	if !g.writing {
		g.writing = true
		p.batch = []*pendingAppend{p}
		g.mu.Unlock()
		return nil
	}
	p.queued = true
	g.queue = append(g.queue, p)
	g.mu.Unlock()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if p.queued {
		g.queue = slices.DeleteFunc(g.queue, func(q *pendingAppend) bool { return q == p })
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	<-p.done
	return nil
}

// next hands the write on after an insert: the first queued append leads
// a batch of what is queued, up to max; with nothing queued, the next
// append to arrive writes at once.
func (g *group) next(max int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.writing = false
		return
	}
	n := min(len(g.queue), max)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	for _, q := range batch {
		q.queued = false
	}
	batch[0].batch = batch
	close(batch[0].done)
}

// writeBatch inserts the batch's commits in one unordered insert, hands
// the write on to the appends queued meanwhile, and gives each append of
// the batch its own outcome: the write error at its index, or the error
// of the whole insert. ctx is the leading append's; the insert outlives
// its cancellation (see appendWriteTimeout).
func (s *EventStore) writeBatch(ctx context.Context, batch []*pendingAppend) {
	docs := make([]any, len(batch))
	for i, p := range batch {
		docs[i] = p.doc
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendWriteTimeout)
	_, err := s.commits.InsertMany(wctx, docs, options.InsertMany().SetOrdered(false))
	if err != nil && wctx.Err() != nil {
		// The store's time ran out, not the caller's: without the
		// deadline error inside, Translate reads it as
		// domain.ErrUnavailable.
		err = fmt.Errorf("insert of %d commits unanswered after %s: %v", len(batch), appendWriteTimeout, err)
	}
	cancel()
	s.group.next(MaxAppendBatch)
	s.metrics.observeBatch(len(batch))

	errs := batchErrors(err, len(batch))
	for i, p := range batch {
		p.err = errs[i]
		if i > 0 {
			close(p.done)
		}
	}
}

// batchErrors splits the outcome of an insert of n documents into the
// outcome of each: a write error goes to the document at its index, as a
// WriteException of its own (so mongo.IsDuplicateKeyError tells of that
// document alone); a write concern error or any other error of the whole
// insert goes to every document without a write error.
func batchErrors(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for _, we := range bwe.WriteErrors {
		if we.Index >= 0 && we.Index < n {
			errs[we.Index] = mongo.WriteException{WriteErrors: mongo.WriteErrors{we.WriteError}, Labels: bwe.Labels}
		}
	}
	if bwe.WriteConcernError != nil {
		rest := mongo.WriteException{WriteConcernError: bwe.WriteConcernError, Labels: bwe.Labels}
		for i := range errs {
			if errs[i] == nil {
				errs[i] = rest
			}
		}
	}
	return errs
}
