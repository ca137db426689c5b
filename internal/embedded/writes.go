package embedded

import (
	"regexp"
	"sync"
	"time"
)

// WriteKind names a kind of write: the command and the collection it
// writes, a rebuilt collection's version and job suffix left out (an
// update of "order_summaries" stands for every version's collection).
type WriteKind struct {
	Command    string // lower-cased: insert, update, findandmodify, ...
	Collection string
}

// WriteCost is what the writes of one kind took of the store's single
// writer: how many, for how long they held it in all, and how long they
// waited for it in all (the writer's queue, by kind).
type WriteCost struct {
	Writes int64
	Held   time.Duration
	Waited time.Duration
}

// writeCosts sums the funnel's writes by kind.
type writeCosts struct {
	mu sync.Mutex
	by map[WriteKind]WriteCost
}

// versioned matches what a rebuild adds to a collection's name:
// "_v<n>" and "_<job id without dashes>".
var versioned = regexp.MustCompile(`(_v[0-9]+)?(_[0-9a-f]{32})?$`)

func (w *writeCosts) add(command, collection string, waited, held time.Duration) {
	k := WriteKind{Command: command, Collection: versioned.ReplaceAllString(collection, "")}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[WriteKind]WriteCost{}
	}
	c := w.by[k]
	c.Writes++
	c.Held += held
	c.Waited += waited
	w.by[k] = c
}

func (w *writeCosts) snapshot() map[WriteKind]WriteCost {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[WriteKind]WriteCost, len(w.by))
	for k, c := range w.by {
		out[k] = c
	}
	return out
}

// writeSlot is the funnel's one connection, held by one write at a time,
// and the time it was held. Writes take it as they come: a class order
// that let inserts into the log go first no longer served more commands
// once the relay stopped writing to the log, and delayed the read models
// (docs/embedded-store.md, "Writes in arrival order").
type writeSlot struct {
	mu    sync.Mutex // held by the write that has the connection
	clock sync.Mutex // guards since and held
	since time.Time  // when the write holding the slot got it; zero when free
	held  time.Duration
}

func (s *writeSlot) acquire() {
	s.mu.Lock()
	s.clock.Lock()
	s.since = time.Now()
	s.clock.Unlock()
}

func (s *writeSlot) release() {
	s.clock.Lock()
	s.held += time.Since(s.since)
	s.since = time.Time{}
	s.clock.Unlock()
	s.mu.Unlock()
}

// busyTime returns how long the slot has been held in all, the write
// holding it now included.
func (s *writeSlot) busyTime() time.Duration {
	s.clock.Lock()
	defer s.clock.Unlock()
	if s.since.IsZero() {
		return s.held
	}
	return s.held + time.Since(s.since)
}
