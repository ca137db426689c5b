// Package domaintest holds test doubles for the domain package's
// interfaces, for the tests of packages that need no MongoDB.
package domaintest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orderd/orderd/domain"
)

var _ domain.EventStore = (*MemStore)(nil)

// MemStore is an in-memory domain.EventStore. It stands for
// mongodb.EventStore in tests that need no MongoDB and keeps the same
// contract:
//
//   - Append stores a commit whole or not at all, under one lock, and only
//     when c.ExpectedVersion is the stream's head (0 for a new stream).
//   - A non-empty idempotency key is unique per stream; the same key on
//     another stream is stored. The key is checked before the version:
//     reusing a key stored in the stream fails with
//     domain.ErrDuplicateRequest even when the version is stale too.
//   - Every event of a stored commit, and the commit's return value, carry
//     one RecordedAt: Now() normalized with domain.Timestamp.
//
// Its state is one list of commits per stream and an index from stream
// and idempotency key to commit. The zero value is ready to use; set Now
// before the store is shared. All methods are safe for concurrent use.
// Contexts are ignored: an Append is never abandoned half way.
type MemStore struct {
	// Now gives the RecordedAt of each append (time.Now when nil).
	Now func() time.Time

	// Down makes every call of Append, Load and FindIdempotencyKey fail
	// with an error wrapping domain.ErrUnavailable, as a store that cannot
	// be reached; each such call is counted in DownCalls.
	Down      atomic.Bool
	DownCalls atomic.Int64
	// Appends counts Append calls, successful or not (Down included).
	Appends atomic.Int64

	mu      sync.Mutex
	streams map[string][]domain.Commit
	keys    map[streamKey]domain.Commit
	events  int
}

// streamKey is an idempotency key in its stream.
type streamKey struct{ stream, key string }

// NewMemStore returns an empty MemStore with the real clock.
func NewMemStore() *MemStore { return &MemStore{} }

func (s *MemStore) unavailable(op string) error {
	if !s.Down.Load() {
		return nil
	}
	s.DownCalls.Add(1)
	return fmt.Errorf("memstore %s: server selection: %w", op, domain.ErrUnavailable)
}

// Append stores c as one commit, or nothing. It returns the commit's
// recorded time, or an error wrapping domain.ErrUnavailable (Down),
// domain.ErrValidation (a malformed commit: domain.Commit.Check),
// domain.ErrDuplicateRequest (c.IdempotencyKey is stored) or
// domain.ErrVersionConflict (c.ExpectedVersion is not the stream's head).
func (s *MemStore) Append(_ context.Context, c domain.Commit) (time.Time, error) {
	s.Appends.Add(1)
	if err := s.unavailable("append"); err != nil {
		return time.Time{}, err
	}
	if err := c.Check(); err != nil {
		return time.Time{}, err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	rec := domain.Timestamp(now())

	s.mu.Lock()
	defer s.mu.Unlock()
	if c.IdempotencyKey != "" {
		if _, ok := s.keys[streamKey{c.StreamID, c.IdempotencyKey}]; ok {
			return time.Time{}, fmt.Errorf("append %s: key %q: %w", c.StreamID, c.IdempotencyKey, domain.ErrDuplicateRequest)
		}
	}
	var head int64
	if cs := s.streams[c.StreamID]; len(cs) > 0 {
		head = cs[len(cs)-1].LastVersion()
	}
	if c.ExpectedVersion != head {
		return time.Time{}, fmt.Errorf("append %s at v%d, head v%d: %w", c.StreamID, c.ExpectedVersion, head, domain.ErrVersionConflict)
	}
	c.Events = slices.Clone(c.Events)
	for i := range c.Events {
		c.Events[i].RecordedAt = rec
	}
	if s.streams == nil {
		s.streams, s.keys = map[string][]domain.Commit{}, map[streamKey]domain.Commit{}
	}
	s.streams[c.StreamID] = append(s.streams[c.StreamID], c)
	if c.IdempotencyKey != "" {
		s.keys[streamKey{c.StreamID, c.IdempotencyKey}] = c
	}
	s.events += len(c.Events)
	return rec, nil
}

// Load returns a copy of the stream's events with a version above after,
// in version order: none (and no error) for an unknown stream. The only
// error wraps domain.ErrUnavailable (Down).
func (s *MemStore) Load(_ context.Context, streamID string, after int64) ([]domain.Event, error) {
	if err := s.unavailable("load"); err != nil {
		return nil, err
	}
	return s.load(streamID, after), nil
}

func (s *MemStore) load(streamID string, after int64) []domain.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var evs []domain.Event
	for _, c := range s.streams[streamID] {
		for _, e := range c.Events {
			if e.Version > after {
				evs = append(evs, e)
			}
		}
	}
	return evs
}

// FindIdempotencyKey returns the commit of stream streamID stored with
// key, with its events (RecordedAt set). It returns an error wrapping
// domain.ErrNotFound when no commit of the stream has key (the empty key
// included), or domain.ErrUnavailable (Down).
func (s *MemStore) FindIdempotencyKey(_ context.Context, key, streamID string) (domain.Commit, error) {
	if err := s.unavailable("find idempotency key"); err != nil {
		return domain.Commit{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.keys[streamKey{streamID, key}]
	if !ok || key == "" {
		return domain.Commit{}, fmt.Errorf("idempotency key %q: %w", key, domain.ErrNotFound)
	}
	c.Events = slices.Clone(c.Events)
	return c, nil
}

// The inspection methods below read the stored state directly: Down does
// not affect them and they are not counted.

// Commits returns the number of stored commits, all streams together.
func (s *MemStore) Commits() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, cs := range s.streams {
		n += len(cs)
	}
	return n
}

// Events returns a copy of the stream's events in version order (nil for
// an unknown stream).
func (s *MemStore) Events(streamID string) []domain.Event { return s.load(streamID, 0) }

// EventCount returns the number of stored events, all streams together.
func (s *MemStore) EventCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events
}

// Streams returns the number of streams with at least one commit.
func (s *MemStore) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// Keys returns the number of stored idempotency keys, each stream's
// counted apart.
func (s *MemStore) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// Reset forgets every commit and key and zeroes Appends and DownCalls.
// Now and Down are kept. Call it when no Append is running.
func (s *MemStore) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams, s.keys, s.events = nil, nil, 0
	s.Appends.Store(0)
	s.DownCalls.Store(0)
}
