package mongodb

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/orderd/orderd/domain"
)

// ServerSelectionTimeout is how long an operation waits for a server it
// can use (a primary, for writes) [15s]. A replica set elects a new
// primary within 10–12 s of losing one (electionTimeoutMillis 10 s plus
// the vote), and the driver's retryable write waits in server selection
// for it: shorter, and every write during an election fails. A store that
// is really down is answered sooner than that by Reachability.
const ServerSelectionTimeout = 15 * time.Second

// ClientOptions returns the MongoDB client options of every role, for the
// connection string uri. Writes are acknowledged by a majority of the
// replica set, journaled (w:majority, j:true), and reads see only
// majority-committed data (readConcern majority) from the primary, so
// nothing a failover can roll back is answered to a client, published by
// the relay, or folded into a read model (docs/guarantees.md); writes and reads
// are retried once across an election. The URI cannot weaken any of
// these (w, j, readConcernLevel, readPreference, retryWrites and
// retryReads in it are overridden); it may set serverSelectionTimeoutMS
// (default ServerSelectionTimeout) and maxPoolSize (default
// DefaultMaxPoolSize).
func ClientOptions(uri string) *options.ClientOptions {
	o := options.Client().SetServerSelectionTimeout(ServerSelectionTimeout).SetMaxPoolSize(DefaultMaxPoolSize).ApplyURI(uri)
	return o.SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: new(true)}).
		SetReadConcern(readconcern.Majority()).SetReadPreference(readpref.Primary()).
		SetRetryWrites(true).SetRetryReads(true)
}

// DefaultMaxPoolSize is the most connections a client opens to each member
// [1100]: above the 1,024 requests an API instance serves at once (the
// driver's default, 100, would make the others wait for a connection
// behind reads) plus the background roles' own.
const DefaultMaxPoolSize = 1100

// Reachability follows the driver's heartbeats to tell a store that is
// down (every known member failed its last heartbeat) from one that is
// electing a primary (members answer, none is primary yet). While the
// store is down, requests are answered unavailable at once instead of
// waiting ServerSelectionTimeout; requests in flight when it goes down are
// cancelled with domain.ErrUnavailable as their context's cause.
type Reachability struct {
	mu       sync.Mutex
	healthy  map[string]bool // member address -> its last heartbeat succeeded
	failure  error           // the last failed heartbeat's error
	inflight map[*inflight]struct{}
}

type inflight struct{ cancel context.CancelCauseFunc }

// NewReachability returns a Reachability that knows no member yet (so it
// reports the store up until a heartbeat fails).
func NewReachability() *Reachability {
	return &Reachability{healthy: map[string]bool{}, inflight: map[*inflight]struct{}{}}
}

// ServerMonitor is the monitor to set on the client
// (options.Client().SetServerMonitor).
func (r *Reachability) ServerMonitor() *event.ServerMonitor {
	return &event.ServerMonitor{
		ServerHeartbeatSucceeded: func(e *event.ServerHeartbeatSucceededEvent) { r.heartbeat(e.ConnectionID, true) },
		ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
			r.mu.Lock()
			r.failure = e.Failure
			r.mu.Unlock()
			r.heartbeat(e.ConnectionID, false)
		},
		ServerClosed: func(e *event.ServerClosedEvent) {
			r.mu.Lock()
			delete(r.healthy, string(e.Address))
			r.mu.Unlock()
		},
	}
}

func (r *Reachability) heartbeat(connectionID string, ok bool) {
	// A heartbeat's connection id is "<address>[-<n>]".
	addr, _, _ := strings.Cut(connectionID, "[")
	r.mu.Lock()
	defer r.mu.Unlock()
	wasDown := r.down()
	r.healthy[addr] = ok
	if !wasDown && r.down() {
		for f := range r.inflight {
			f.cancel(fmt.Errorf("store: every member failed its heartbeat: %w", domain.ErrUnavailable))
		}
	}
}

// Ready is the store's readiness check: nil unless it is down. A replica
// set electing a primary is not down (its members answer their
// heartbeats), and commands wait the election out in server selection
// (ServerSelectionTimeout), so an instance stays ready through it instead
// of leaving the load balancer for the 10–12 s a ping would fail. Errors:
// domain.ErrUnavailable.
func (r *Reachability) Ready(context.Context) error {
	r.mu.Lock()
	down, failure := r.down(), r.failure
	r.mu.Unlock()
	if down {
		return fmt.Errorf("store: every member failed its heartbeat (last: %v): %w", failure, domain.ErrUnavailable)
	}
	return nil
}

// down reports whether every known member failed its last heartbeat.
func (r *Reachability) down() bool {
	for _, ok := range r.healthy {
		if ok {
			return false
		}
	}
	return len(r.healthy) > 0
}

// Bound returns ctx, cancelled with domain.ErrUnavailable as its cause if
// the store goes down before the returned CancelFunc is called; or an
// error wrapping domain.ErrUnavailable if it is down now.
func (r *Reachability) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down() {
		return ctx, func() {}, fmt.Errorf("store: every member failed its last heartbeat: %w", domain.ErrUnavailable)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	f := &inflight{cancel: cancel}
	r.inflight[f] = struct{}{}
	return ctx, func() {
		r.mu.Lock()
		delete(r.inflight, f)
		r.mu.Unlock()
		cancel(context.Canceled)
	}, nil
}
