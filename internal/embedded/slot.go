package embedded

import (
	"sync"
	"time"
)

// writeClass orders the writes waiting for the funnel's one connection.
// The single SQLite writer serves one write at a time whoever sends it; on
// MongoDB a command's insert does not queue behind unrelated writes, so
// the funnel lets the small, interactive writes go first:
type writeClass int

const (
	// classInsert: an insert into the event log (LogCollection), of one
	// commit or of the group of commits of concurrent commands, and any
	// other insert of one document.
	classInsert writeClass = iota
	// classUpdate: one findAndModify, an update or delete of one
	// statement (leases, claims, the relay's checkpoint), or an update of
	// guarded statements (read-model batches).
	classUpdate
	// classBulk: other writes of several statements (rebuild bulk
	// inserts, say) and changes of collections and indexes.
	classBulk
	classes
)

// maxWriteWait is how long a write of a later class waits while earlier
// classes keep arriving: after it the oldest waiter goes first, whatever
// its class, so no write starves. A shorter wait serves fewer commands a
// second; this one keeps the read models within their freshness goal
// (docs/embedded-store.md, "Why a write waits at most 250 ms for its class").
const maxWriteWait = 250 * time.Millisecond

// writeSlot is the funnel's connection as a resource held by one write at
// a time, handed on by class and then by arrival (see writeClass).
type writeSlot struct {
	mu      sync.Mutex
	busy    bool
	waiting [classes][]*slotWaiter
	maxWait time.Duration // maxWriteWait; 0 serves in arrival order
	since   time.Time     // when the write holding the slot got it
	held    time.Duration // the slot's time held, summed over the writes that released it
}

type slotWaiter struct {
	ready chan struct{}
	since time.Time
}

// acquire waits until the slot is this write's.
func (s *writeSlot) acquire(c writeClass) {
	s.mu.Lock()
	if !s.busy {
		s.busy, s.since = true, time.Now()
		s.mu.Unlock()
		return
	}
	w := &slotWaiter{ready: make(chan struct{}), since: time.Now()}
	s.waiting[c] = append(s.waiting[c], w)
	s.mu.Unlock()
	<-w.ready
}

// release hands the slot to the next waiter: the longest waiting one if it
// has waited maxWait, else the first of the earliest class.
func (s *writeSlot) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.held += now.Sub(s.since)
	s.since = now // the next holder's, if any
	next := -1
	for c := range s.waiting {
		if len(s.waiting[c]) == 0 {
			continue
		}
		if next < 0 {
			next = c
		}
		if w := s.waiting[c][0]; time.Since(w.since) >= s.maxWait && w.since.Before(s.waiting[next][0].since) {
			next = c
		}
	}
	if next < 0 {
		s.busy = false
		return
	}
	w := s.waiting[next][0]
	s.waiting[next][0] = nil
	s.waiting[next] = s.waiting[next][1:]
	close(w.ready) // the slot stays busy: it is w's now
}

// busyTime returns how long the slot has been held in all, the write
// holding it now included.
func (s *writeSlot) busyTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		return s.held + time.Since(s.since)
	}
	return s.held
}

// LogCollection is the collection of the event log (the mongodb
// package's CommitsCollection), whose inserts are commands' appends.
const LogCollection = "events"

// classOf is the class of the write command cmd whose request is req;
// name is cmd's name, lower-cased.
func classOf(name string, cmd command) writeClass {
	switch name {
	case "findandmodify":
		return classUpdate
	case "insert":
		// The event store writes concurrent appends in one insert (group
		// commit): an insert into the log is commands waiting, whatever
		// its size; elsewhere, several documents are a bulk load.
		if n := statements(cmd.msg, "documents"); n == 1 || n > 1 && cmd.collection == LogCollection {
			return classInsert
		}
	case "update", "delete":
		if statements(cmd.msg, name+"s") == 1 {
			return classUpdate
		}
		if _, _, _, guarded := guardedUpdates(cmd.msg); name == "update" && guarded {
			// A read-model batch: one version-guarded write per stream.
			return classUpdate
		}
	}
	return classBulk
}
