package embedded

import (
	"maps"
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
	Writes       int64
	Held, Waited time.Duration
}

// versioned matches what a rebuild adds to a collection's name:
// "_v<n>" and "_<job id without dashes>".
var versioned = regexp.MustCompile(`(_v[0-9]+)?(_[0-9a-f]{32})?$`)

// writeSlot is the funnel's one connection, held by one write at a time,
// and the time each kind of write held it. Writes take it as they come: a
// class order that let inserts into the log go first no longer served
// more commands once the relay stopped writing to the log, and delayed the
// read models (docs/embedded-store.md, "Why writes go in arrival order").
type writeSlot struct {
	mu    sync.Mutex // held by the write that has the connection
	clock sync.Mutex // guards since and by
	since time.Time  // when the write holding the slot got it; zero when free
	by    map[WriteKind]WriteCost
}

func (s *writeSlot) acquire() {
	s.mu.Lock()
	s.clock.Lock()
	s.since = time.Now()
	s.clock.Unlock()
}

// release frees the slot and counts its time, and the time the write
// waited for it since asked, under the write's command (lower-cased) and
// collection.
func (s *writeSlot) release(command, collection string, asked time.Time) {
	k := WriteKind{Command: command, Collection: versioned.ReplaceAllString(collection, "")}
	s.clock.Lock()
	if s.by == nil {
		s.by = map[WriteKind]WriteCost{}
	}
	c := s.by[k]
	c.Writes, c.Held, c.Waited = c.Writes+1, c.Held+time.Since(s.since), c.Waited+s.since.Sub(asked)
	s.by[k], s.since = c, time.Time{}
	s.clock.Unlock()
	s.mu.Unlock()
}

// busyTime returns how long the slot has been held in all, the write
// holding it now included.
func (s *writeSlot) busyTime() time.Duration {
	s.clock.Lock()
	defer s.clock.Unlock()
	var held time.Duration
	for _, c := range s.by {
		held += c.Held
	}
	if !s.since.IsZero() {
		held += time.Since(s.since)
	}
	return held
}

func (s *writeSlot) costs() map[WriteKind]WriteCost {
	s.clock.Lock()
	defer s.clock.Unlock()
	return maps.Clone(s.by)
}
