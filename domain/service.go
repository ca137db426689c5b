package domain

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Commit is the unit of append: the events of one command, stored as one
// document so the append is atomic (invariant 1). Events carry versions
// ExpectedVersion+1 .. ExpectedVersion+len(Events). IdempotencyKey, when
// set, is stored in the commit under a unique index together with
// RequestHash, the fingerprint of the request that used it (invariant 7).
// A key is unique per stream: the index is (stream_id, idempotency_key), so
// the event collection can be sharded by stream_id.
type Commit struct {
	StreamID        string
	StreamType      string
	ExpectedVersion int64
	Events          []Event
	IdempotencyKey  string
	RequestHash     string
}

// LastVersion is the stream version after the commit.
func (c Commit) LastVersion() int64 { return c.ExpectedVersion + int64(len(c.Events)) }

// Check returns an error wrapping ErrValidation when c is not a commit an
// event store stores: an invalid stream id, no events, a negative expected
// version, or an event that does not fit it (not the next version, of
// another stream, without id, without payload or with one of another
// type, or with another correlation id than the first event's: a commit
// holds one command's events).
func (c Commit) Check() error {
	if err := ValidateID("stream id", c.StreamID); err != nil {
		return err
	}
	if len(c.Events) == 0 || c.ExpectedVersion < 0 {
		return fmt.Errorf("append %s at v%d with %d events: %w", c.StreamID, c.ExpectedVersion, len(c.Events), ErrValidation)
	}
	for i, e := range c.Events {
		if e.Version != c.ExpectedVersion+int64(i)+1 || e.StreamID != c.StreamID || e.ID == "" || e.Data == nil || e.Data.EventType() != e.Type ||
			e.Metadata.CorrelationID != c.Events[0].Metadata.CorrelationID {
			return fmt.Errorf("append %s: event %d (%s v%d) does not fit the commit: %w", c.StreamID, i, e.Type, e.Version, ErrValidation)
		}
	}
	return nil
}

// EventStore is the event log as the Service needs it.
//
// Append stores c or nothing. ExpectedVersion must be a version the stream
// has had (0 for a new stream): the store does not read the head, and a
// stale ExpectedVersion collides with the commit that followed it. Append
// returns ErrVersionConflict when the stream moved on, ErrDuplicateRequest
// when c.IdempotencyKey is already stored in a commit of c.StreamID (the
// same key on another stream is no conflict), ErrValidation for a malformed
// commit and ErrUnavailable when the store cannot be reached.
//
// Load returns a stream's events after version after, in version order
// (none for an unknown stream). after is 0 or a head the caller saw (the
// version right after one of the stream's commits), so the store can start
// reading at the next commit; a commit it cannot read is an error wrapping
// ErrUnreadableCommit. FindIdempotencyKey returns the commit of stream
// streamID that stored key, with its events, or an error wrapping
// ErrNotFound (also for an empty key or an invalid stream id).
type EventStore interface {
	Append(ctx context.Context, c Commit) (recordedAt time.Time, err error)
	Load(ctx context.Context, streamID string, after int64) ([]Event, error)
	FindIdempotencyKey(ctx context.Context, key, streamID string) (Commit, error)
}

// StateCache keeps the last folded state of recently used streams, so a
// command usually needs no read before its append. Entries may be stale
// (another instance appended since): the append's expected version then
// collides and the Service reloads. Implementations must be safe for
// concurrent use. The method set is that of hashicorp/golang-lru/v2's
// *lru.Cache[string, Order], which the service uses as it is; the Service
// ignores the results of Add (an eviction) and Remove (a key was present).
type StateCache interface {
	Get(streamID string) (Order, bool)
	Add(streamID string, o Order) (evicted bool)
	Remove(streamID string) (present bool)
}

// ExecOptions are the per-request options of Service.Execute. IfMatch, when
// set, is the command's precondition: unless it matches the order, the
// command fails with ErrPreconditionFailed. CommandID becomes the causation
// id of the events (a new one is made when empty).
type ExecOptions struct {
	IdempotencyKey string
	IfMatch        *IfMatch
	CorrelationID  string
	CommandID      string
}

// IfMatch is a precondition on the order's version, what RFC 9110's
// If-Match (§13.1.1) means with the ETag "<version>": Any ("*") holds
// for every existing order, Versions for an order at one of them (none:
// for no order). With Versions a command that loses a version race is
// not retried: the version it was decided on is gone.
type IfMatch struct {
	Any      bool
	Versions []int64
}

// holds reports whether m holds for o; an order of version 0 does not exist.
func (m IfMatch) holds(o Order) bool {
	return o.Version > 0 && (m.Any || slices.Contains(m.Versions, o.Version))
}

func (m IfMatch) String() string {
	if m.Any {
		return "*"
	}
	vs := make([]string, len(m.Versions))
	for i, v := range m.Versions {
		vs[i] = "v" + strconv.FormatInt(v, 10)
	}
	return strings.Join(vs, ", ")
}

// Result is what a command did. Replayed is true when the result is the
// stored result of an earlier request with the same idempotency key (or an
// identical PlaceOrder) and nothing was appended. Attempts counts decide-
// and-append rounds (more than 1 after lost version races).
type Result struct {
	OrderID  string
	Version  int64
	Status   Status
	Replayed bool
	Attempts int
}

// Service handles commands: it folds the stream (or takes it from the
// cache), decides, and appends under optimistic concurrency. Without
// If-Match it retries a lost race up to MaxAttempts times with full-jitter
// exponential backoff (Brooker, "Exponential Backoff And Jitter", AWS
// Architecture Blog, 2015), starting at BaseBackoff.
type Service struct {
	Store       EventStore
	Cache       StateCache // optional
	Now         func() time.Time
	NewID       func() string
	MaxAttempts int
	BaseBackoff time.Duration
}

// NewService returns a Service with the defaults: 6 attempts, 2 ms base
// backoff, time.Now and random 128-bit hex ids (callers usually set NewID
// to a UUID generator).
func NewService(store EventStore, cache StateCache) *Service {
	return &Service{Store: store, Cache: cache, Now: time.Now, NewID: randomID, MaxAttempts: 6, BaseBackoff: 2 * time.Millisecond}
}

// randomID returns 128 random bits in hex from the runtime-seeded
// math/rand/v2 generator: unique enough for ids, not secret.
func randomID() string {
	return fmt.Sprintf("%016x%016x", mrand.Uint64(), mrand.Uint64())
}

// Get returns the order as folded from the log: always fresh. A cached
// state is used only after the log confirms that no commit follows it
// (one read of the events after it); else the whole stream is read. Get
// adds nothing to the cache. Returns ErrNotFound for an unknown order.
func (s *Service) Get(ctx context.Context, orderID string) (Order, error) {
	if err := ValidateID("order id", orderID); err != nil {
		return Order{}, err
	}
	var o Order
	if s.Cache != nil {
		if cached, ok := s.Cache.Get(orderID); ok {
			o = cached
		}
	}
	events, err := s.Store.Load(ctx, orderID, o.Version)
	if err != nil {
		return Order{}, err
	}
	for _, e := range events {
		if err := o.Apply(e); err != nil {
			return Order{}, fmt.Errorf("fold order %s: %w", orderID, err)
		}
	}
	if o.Version == 0 {
		return Order{}, fmt.Errorf("order %s: %w", orderID, ErrNotFound)
	}
	return o, nil
}

// Bound is a point in a stream's history: the stream up to and including
// version Version (>= 1), or the events recorded up to and including At
// (RecordedAt, the store's commit time, not the client's OccurredAt). The
// zero Bound is the head.
type Bound struct {
	Version int64
	At      time.Time
}

// EventsUntil folds the order from its events up to b (the zero Bound:
// the whole stream) and returns them, never from the cache and without
// adding to it: a past state is read whole from the log. The stream is loaded in one read and cut here.
// Errors: ErrValidation for an invalid id; ErrNotFound for an unknown
// order, a b.Version past the head or a b.At before the first event (the
// message names the head version); ErrUnreadableCommit, ErrUnavailable.
func (s *Service) EventsUntil(ctx context.Context, orderID string, b Bound) (Order, []Event, error) {
	if err := ValidateID("order id", orderID); err != nil {
		return Order{}, nil, err
	}
	events, err := s.Store.Load(ctx, orderID, 0)
	if err != nil {
		return Order{}, nil, err
	}
	if len(events) == 0 {
		return Order{}, nil, fmt.Errorf("order %s: %w", orderID, ErrNotFound)
	}
	head := events[len(events)-1].Version
	n := len(events)
	switch {
	case b.Version > 0:
		if b.Version > head {
			return Order{}, nil, fmt.Errorf("order %s has no version %d: its head is v%d: %w", orderID, b.Version, head, ErrNotFound)
		}
		n = int(b.Version)
	case !b.At.IsZero():
		for n > 0 && events[n-1].RecordedAt.After(b.At) {
			n--
		}
		if n == 0 {
			return Order{}, nil, fmt.Errorf("order %s did not exist at %s: its first event was recorded at %s (head v%d): %w",
				orderID, b.At.UTC().Format(time.RFC3339Nano), events[0].RecordedAt.UTC().Format(time.RFC3339Nano), head, ErrNotFound)
		}
	}
	events = events[:n]
	o, err := Fold(events)
	if err != nil {
		return Order{}, nil, fmt.Errorf("fold order %s: %w", orderID, err)
	}
	return o, events, nil
}

// Execute runs cmd against order orderID. For PlaceOrder an empty orderID
// gets KeyedOrderID(opt.IdempotencyKey) when a key is set, so a retry lands
// on the stream of the first request, and a new id (NewID) otherwise, so
// every such request places another order. An idempotency key belongs to
// the order it was used on: the same key on another order is another
// request. Errors: ErrValidation, ErrNotFound, ErrInvalidTransition,
// ErrAlreadyExists, ErrPreconditionFailed, ErrIdempotencyKeyReused,
// ErrVersionConflict (retries exhausted) and ErrUnavailable.
func (s *Service) Execute(ctx context.Context, orderID string, cmd Command, opt ExecOptions) (Result, error) {
	_, placing := cmd.(PlaceOrder)
	clientID := orderID
	if orderID == "" && placing {
		if opt.IdempotencyKey != "" {
			orderID = KeyedOrderID(opt.IdempotencyKey)
		} else {
			orderID = s.NewID()
		}
	}
	if err := ValidateID("order id", orderID); err != nil {
		return Result{}, err
	}
	// No look-up of the idempotency key before deciding: the key's unique
	// index is the authority, and a retry of a request that succeeded
	// always fails to decide (the transition happened) or to append (the
	// key is taken), which is when the key is looked up. First tries cost
	// no read.
	hash := requestHash(clientID, cmd)
	if opt.CommandID == "" {
		opt.CommandID = s.NewID()
	}
	if opt.CorrelationID == "" {
		opt.CorrelationID = opt.CommandID
	}
	assume := true
	for attempt := 1; ; attempt++ {
		o, assumed, err := s.state(ctx, orderID, assume, placing)
		if err != nil {
			return Result{}, err
		}
		res, err := s.try(ctx, orderID, o, cmd, opt, hash)
		res.Attempts = attempt
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, ErrUnavailable):
			// Re-deciding on the log or looking the key up would wait for
			// the store again: fail fast; the client retries with its key.
			return res, err
		case assumed && !errors.Is(err, ErrVersionConflict) && !errors.Is(err, ErrDuplicateRequest) && !errors.Is(err, ErrValidation):
			// The assumed state may be stale: decide again on the log's
			// state before refusing, without counting an attempt.
			assume, attempt = false, attempt-1
			continue
		case errors.Is(err, ErrDuplicateRequest):
			return s.replay(ctx, opt.IdempotencyKey, orderID, hash)
		case errors.Is(err, ErrVersionConflict):
			if s.Cache != nil {
				s.Cache.Remove(orderID)
			}
			if opt.IfMatch != nil && !opt.IfMatch.Any {
				return res, fmt.Errorf("%s order %s: If-Match %s: %w", CommandName(cmd), orderID, opt.IfMatch, ErrPreconditionFailed)
			}
			if attempt >= s.MaxAttempts {
				return res, fmt.Errorf("%s order %s after %d attempts: %w", CommandName(cmd), orderID, attempt, err)
			}
			if !assumed { // a stale assumption is no contention: reload at once
				if err := s.sleep(ctx, attempt); err != nil {
					return res, err
				}
			}
			assume = false
		default:
			if opt.IdempotencyKey != "" {
				// A retry of a request that committed: its result is the
				// answer.
				if r, rerr := s.replay(ctx, opt.IdempotencyKey, orderID, hash); !errors.Is(rerr, ErrNotFound) {
					return r, rerr
				}
			}
			return res, err
		}
	}
}

// state returns the stream's state: when assume is set, from the cache, or
// for a PlaceOrder the empty state of a new stream (assumed=true: not read,
// so possibly stale); otherwise from the log (Get; the zero Order for a
// new stream).
func (s *Service) state(ctx context.Context, orderID string, assume, placing bool) (o Order, assumed bool, err error) {
	if assume && s.Cache != nil {
		if o, ok := s.Cache.Get(orderID); ok {
			return o, true, nil
		}
	}
	if assume && placing {
		return Order{}, true, nil
	}
	if o, err = s.Get(ctx, orderID); errors.Is(err, ErrNotFound) {
		return Order{}, false, nil
	}
	return o, false, err
}

// try decides cmd on o and appends the result.
func (s *Service) try(ctx context.Context, orderID string, o Order, cmd Command, opt ExecOptions, hash string) (Result, error) {
	if p, ok := cmd.(PlaceOrder); ok && o.SamePlacement(p) {
		if opt.IdempotencyKey != "" {
			// A retry of the first request: its result, not today's state.
			if r, err := s.replay(ctx, opt.IdempotencyKey, orderID, hash); !errors.Is(err, ErrNotFound) {
				return r, err
			}
		}
		return Result{OrderID: orderID, Version: o.Version, Status: o.Status, Replayed: true}, nil
	}
	if opt.IfMatch != nil && !opt.IfMatch.holds(o) {
		if o.Version == 0 {
			return Result{}, fmt.Errorf("%s order %s: no such order, If-Match %s: %w", CommandName(cmd), orderID, opt.IfMatch, ErrPreconditionFailed)
		}
		return Result{}, fmt.Errorf("%s order %s: at v%d, If-Match %s: %w", CommandName(cmd), orderID, o.Version, opt.IfMatch, ErrPreconditionFailed)
	}
	d, at, err := o.Decide(cmd, s.Now())
	if err != nil {
		return Result{}, err
	}
	c := Commit{StreamID: orderID, StreamType: StreamTypeOrder, ExpectedVersion: o.Version,
		IdempotencyKey: opt.IdempotencyKey, RequestHash: hash, Events: []Event{{
			ID: s.NewID(), StreamID: orderID, StreamType: StreamTypeOrder, Type: d.EventType(),
			Version: o.Version + 1, OccurredAt: at, Data: d,
			Metadata: Metadata{CorrelationID: opt.CorrelationID, CausationID: opt.CommandID, SchemaVersion: CurrentSchema(d.EventType())},
		}}}
	recordedAt, err := s.Store.Append(ctx, c)
	if err != nil {
		return Result{}, err
	}
	e := c.Events[0]
	e.RecordedAt = recordedAt
	if err := o.Apply(e); err != nil {
		return Result{}, fmt.Errorf("apply own event: %w", err)
	}
	if s.Cache != nil {
		s.Cache.Add(orderID, o)
	}
	return Result{OrderID: orderID, Version: o.Version, Status: o.Status}, nil
}

// replay answers a request whose idempotency key is stored in order
// orderID: with the stored result when it is the same request, else
// ErrIdempotencyKeyReused. It returns ErrNotFound when the key is not
// stored there.
func (s *Service) replay(ctx context.Context, key, orderID, hash string) (Result, error) {
	c, err := s.Store.FindIdempotencyKey(ctx, key, orderID)
	if err != nil {
		return Result{}, err
	}
	if c.RequestHash != hash || c.StreamID != orderID {
		return Result{}, fmt.Errorf("idempotency key %q: %w", key, ErrIdempotencyKeyReused)
	}
	// The first result is the state right after that commit.
	first, _, err := s.EventsUntil(ctx, c.StreamID, Bound{Version: c.LastVersion()})
	if err != nil {
		return Result{}, err
	}
	return Result{OrderID: c.StreamID, Version: first.Version, Status: first.Status, Replayed: true}, nil
}

// sleep waits a random time up to BaseBackoff << attempt (full jitter),
// or until ctx is done.
func (s *Service) sleep(ctx context.Context, attempt int) error {
	max := s.BaseBackoff << min(attempt, 10)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(mrand.Int64N(int64(max) + 1))):
		return nil
	}
}

// requestHash fingerprints a command for idempotency checks (128-bit
// FNV-1a: it only tells two requests of one client apart, so it need not
// resist a forger): the command
// name, the order id the client named (empty when the server chooses it)
// and the command's JSON form.
func requestHash(clientID string, cmd Command) string {
	b, _ := json.Marshal(cmd)
	h := fnv.New128a()
	h.Write([]byte(CommandName(cmd)))
	h.Write([]byte{0})
	h.Write([]byte(clientID))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}
