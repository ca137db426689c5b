package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// tracer records the projections' spans through the global OpenTelemetry
// provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/projector")

// RunnerConfig tunes a Runner. Zero values take the defaults in brackets.
type RunnerConfig struct {
	Stream string // JetStream stream name
	// SubjectPrefix is the event subject space, e.g. "orders.events". The
	// stream maps each event's subject <prefix>.<stream id> to
	// <prefix>.<partition>.<stream id> (bus.StreamConfig.Partitions),
	// and partition p is consumed with the filter <prefix>.<p>.>.
	SubjectPrefix string
	// Partitions is how many partitions the stream splits the events into
	// [DefaultPartitions]; it must equal the stream's.
	Partitions int
	Owner      string // instance id holding partition leases [host name and pid]
	// Workers is how many pull loops consume each partition this process
	// owns [1]: one keeps each order's events in order, so gaps (and the
	// log reads that fill them) are rare.
	Workers   int
	BatchSize int // most messages folded per write round [256]
	// Writers is how many write rounds of this projection may be in
	// flight at once in this process, whatever the number of partitions it
	// owns [2]. A worker waiting for a slot keeps receiving, so its next
	// batch is larger and the events of one stream in it fold into one
	// document write: on a store with one writer (the embedded store) 16
	// partitions with a round each in flight wrote a document per event,
	// far more writes than 2 rounds (docs/benchmarks.md, "Why at most 2
	// write rounds of a projection in flight").
	// Raise it where the store takes parallel writes (MongoDB).
	Writers       int
	MaxDeliveries int           // deliveries of a failing event before it is parked [5]
	AckWait       time.Duration // redelivery timeout of an unacknowledged message [30s]
	LagInterval   time.Duration // consumer lag sampling [2s]
	// LeaseTTL is how long a partition lease and a member heartbeat last
	// without renewal [10s]. Leases are renewed every LeaseTTL/4, the
	// heartbeat and the rebalance run every LeaseTTL/3; an owner whose
	// renewals fail for LeaseTTL/2 stops writing, before the lease can
	// pass to another process, and writes again when a renewal gets
	// through while no other process has claimed the lease.
	LeaseTTL time.Duration
	// OnOwnership, when set, is called when this process is about to start
	// writing a partition (start true, before its first write) and when it
	// has stopped (start false, after its last), so ownerships can be
	// audited.
	OnOwnership func(projection string, partition int, start bool)
	// Retired names projections that earlier versions of the service ran
	// and this one does not (projection.Retired): their consumers and
	// partition leases are deleted once no live member runs them.
	Retired []string
}

// Projection is a read model as a Runner feeds it, whatever its document
// type, and the store of its partition leases and members, which live and
// go with it. The MongoDB adapter's *mongodb.Projection[D] implements it.
type Projection interface {
	applier
	// Name is the projection's name (projection.Definition.Name).
	Name() string
	// Key names the version of the definition this process folds
	// (projection.Definition.Key): its consumers and leases.
	Key() string
	// Version is the version of the definition this process folds
	// (projection.Definition.Ver, at least 1).
	Version() int
	// Pointer returns the projection's pointer document, read from the
	// store unless this process read it less than maxAge ago. Errors:
	// domain.ErrUnavailable.
	Pointer(ctx context.Context, maxAge time.Duration) (projection.Pointer, error)
	// Partitions returns the partition leases of the projection's
	// version key.
	Partitions(key string) Partitions
	// Members returns the members of the projection's version key, from
	// the side of the process owner, whose heartbeats last ttl.
	Members(key, owner string, ttl time.Duration) Members
}

// applier is what a Runner writes through: the projection's guarded
// writes (Apply returns what the batch did, the streams that could not be
// applied with their errors, and a failure of the whole batch, such as
// domain.ErrUnavailable), its indexes, and Purge, which forgets the
// documents the projection caches.
type applier interface {
	Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error)
	EnsureIndexes(ctx context.Context) error
	Purge()
}

// Runner feeds one projection from JetStream, split into partitions by
// stream id: partition p has its own durable pull consumer,
// "proj_<name>_p<NN>", and is consumed by exactly one process at a time,
// the holder of its lease in PartitionsCollection. This is the model of
// Axon's tracking-processor segments and of Kafka's consumer groups: every
// process running the projection heartbeats in MembersCollection, the
// live members share the partitions evenly (fairShare, Kafka's range
// assignment over the members sorted by id), a member above its share
// releases partitions when another joins, and a member below it claims
// free or expired ones when another leaves or dies. Events of one stream
// stay in one partition, so in order, and gap fills are rare.
//
// A deposed owner stops writing before its successor starts: a release
// comes after the partition's workers have stopped, and an owner whose
// renewals fail stops writing after LeaseTTL/2, while a successor can
// claim only after LeaseTTL. The owner keeps the partition meanwhile and
// writes again once a renewal gets through at the same epoch, so a store
// election longer than LeaseTTL/2 costs no hand-over; a renewal that finds
// the lease claimed by another ends the ownership. A write that was already
// on its way when the owner stopped lands late: the version guard makes
// it harmless (invariant 4).
//
// Within a partition, each worker takes the messages at hand (up to
// BatchSize), folds them with one read and one bulk write per round, and
// acknowledges a message only once its stream's document reflects it.
// Events that cannot be applied are redelivered with backoff and, after
// MaxDeliveries, parked in the dead-letter collection and terminated;
// failures that may pass (store down) are redelivered without limit.
type Runner struct {
	name    string
	key     string // the version's name for its consumers and leases
	version int
	// versionLeases returns the member and partition leases of another
	// version key of the projection (retireVersions).
	versionLeases func(key string) (Members, Partitions)
	pointer       func(context.Context) (projection.Pointer, error)
	store         applier
	js            jetstream.JetStream
	dead          DeadLetterStore
	leases        Partitions
	members       Members
	cfg           RunnerConfig
	log           *slog.Logger
	metrics       *Metrics
	lastErr       atomic.Pointer[string]
	writers       chan struct{} // a slot per write round in flight (Writers)
	clock         *lagClock

	// Run's goroutine changes owned, under mu; renewLoop reads it under
	// mu. The other fields are Run's goroutine's only.
	mu     sync.Mutex
	owned  map[int]*ownership
	joined bool      // heartbeating as a member
	busOK  time.Time // last time JetStream answered
}

// ownership is this process's hold on one partition, from its claim until
// its workers have stopped.
type ownership struct {
	p      int
	lease  Lease           // as claimed: its epoch fences the renewals and the release
	ctx    context.Context // the workers'; done once the partition stops
	cancel context.CancelFunc
	done   chan struct{}
	// fence closes gate LeaseTTL/2 after the last successful renewal was
	// sent; each renewal pushes it back, and one after the fence opens
	// the gate again.
	fence   *time.Timer
	gate    *writeGate
	taken   atomic.Bool // the lease passed to another owner
	applied atomic.Int64
	// The apply counter at the previous heartbeat, for the rate.
	ratedApplied int64
	ratedAt      time.Time
}

// stats returns what this process applied in each partition it holds
// since its claim, and per second since the previous call.
func (r *Runner) stats() []PartitionReport {
	now := time.Now()
	var out []PartitionReport
	for _, p := range r.ownedPartitions() {
		tn := r.ownership(p)
		st := PartitionReport{Partition: p, Applied: tn.applied.Load()}
		if d := now.Sub(tn.ratedAt).Seconds(); d > 0 {
			st.Rate = float64(st.Applied-tn.ratedApplied) / d
		}
		tn.ratedApplied, tn.ratedAt = st.Applied, now
		out = append(out, st)
	}
	return out
}

// LastError is the last failure of this process's workers: a batch that
// could not be written, or an event parked; "" when there was none.
func (r *Runner) LastError() string {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

func (r *Runner) setLastError(err error) {
	msg := err.Error()
	r.lastErr.Store(&msg)
}

// NewRunner returns a Runner feeding the projection p; its partition
// leases and members are p's.
func NewRunner(p Projection, js jetstream.JetStream, dead DeadLetterStore, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	cfg.setDefaults()
	// Partition leases, members and consumers are the version's: during
	// a rolling upgrade the processes of each version share the
	// partitions among themselves and feed that version's collections.
	return &Runner{name: p.Name(), key: p.Key(), version: p.Version(),
		versionLeases: func(key string) (Members, Partitions) {
			return p.Members(key, cfg.Owner, cfg.LeaseTTL), p.Partitions(key)
		},
		pointer: func(ctx context.Context) (projection.Pointer, error) { return p.Pointer(ctx, 0) }, store: p, js: js, dead: dead, cfg: cfg, log: log.With("projection", p.Name(), "version", p.Version()), metrics: m,
		leases: p.Partitions(p.Key()), members: p.Members(p.Key(), cfg.Owner, cfg.LeaseTTL),
		writers: make(chan struct{}, cfg.Writers), clock: newLagClock()}
}

// WithDefaults returns c with its zero fields set to the defaults in
// brackets, for a program that shows or checks them before NewRunner.
func (c RunnerConfig) WithDefaults() RunnerConfig {
	c.setDefaults()
	return c
}

func (c *RunnerConfig) setDefaults() {
	if c.Partitions <= 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Workers <= 0 {
		c.Workers = 1
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.Writers <= 0 {
		c.Writers = 2
	}
	if c.MaxDeliveries <= 0 {
		c.MaxDeliveries = 5
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.LagInterval <= 0 {
		c.LagInterval = 2 * time.Second
	}
}

// Name is the projection's name.
func (r *Runner) Name() string { return r.name }

// Partitions is the number of partitions.
func (r *Runner) Partitions() int { return r.cfg.Partitions }

// Key names the projection's version (projection.Definition.Key).
func (r *Runner) Key() string { return r.key }

// ConsumerName is the durable consumer of partition p: "proj_<key>_p<NN>",
// where key is the projection's name for its first version.
func (r *Runner) ConsumerName(p int) string { return fmt.Sprintf("proj_%s_p%02d", r.key, p) }

// FilterSubject is the subject filter of partition p: "<prefix>.<p>.>".
func (r *Runner) FilterSubject(p int) string { return fmt.Sprintf("%s.%d.>", r.cfg.SubjectPrefix, p) }

// Consumer returns the durable consumer of partition p, creating or
// updating it only when it is missing or its settings differ: in a
// cluster, looking a consumer up is answered by its leader, while creating
// or updating one needs the meta leader, so a partition claimed during a
// meta-leader election still starts.
func (r *Runner) Consumer(ctx context.Context, p int) (jetstream.Consumer, error) {
	want := jetstream.ConsumerConfig{
		Durable:       r.ConsumerName(p),
		FilterSubject: r.FilterSubject(p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       r.cfg.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    -1,
		MaxAckPending: 4 * r.cfg.Workers * r.cfg.BatchSize,
	}
	c, err := r.js.Consumer(ctx, r.cfg.Stream, want.Durable)
	if err == nil && sameConsumer(c.CachedInfo().Config, want) {
		return c, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	c, err = r.js.CreateOrUpdateConsumer(ctx, r.cfg.Stream, want)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", want.Durable, err)
	}
	return c, nil
}

// retireInterval is how often a Runner looks for what the projection's
// other versions left behind (retireVersions).
const retireInterval = time.Minute

// retire runs retireVersions and retireProjections bounded by a quarter
// of the lease; a failure is logged and tried again at the next interval.
func (r *Runner) retire(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/4)
	defer cancel()
	if err := r.retireAll(rctx); err != nil && ctx.Err() == nil {
		r.log.Warn("projection versions not retired; trying again later", "err", err)
	}
}

// sameConsumer reports whether have already holds every setting of want
// that Consumer sets.
func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	return have.Durable == want.Durable && have.FilterSubject == want.FilterSubject && len(have.FilterSubjects) == 0 &&
		have.AckPolicy == want.AckPolicy && have.AckWait == want.AckWait && have.DeliverPolicy == want.DeliverPolicy &&
		have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending
}

// Run ensures the indexes, the partitions' lease documents and consumers,
// then joins the projection's members and consumes the partitions this
// process is given, rebalancing every LeaseTTL/3, until ctx is done; then
// it stops its workers, releases its partitions and leaves. It returns nil
// on cancellation, and an error only when it could not start (the caller
// restarts it): a partition whose consumer fails is restarted on its own,
// and the other partitions' workers go on.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.store.EnsureIndexes(ctx); err != nil {
		return err
	}
	if err := r.leases.Ensure(ctx, r.cfg.Partitions); err != nil {
		return err
	}
	for p := range r.cfg.Partitions {
		if _, err := r.Consumer(ctx, p); err != nil {
			return err
		}
	}
	r.metrics.initProjection(r.name)
	r.owned, r.joined = map[int]*ownership{}, false
	defer r.leave(context.WithoutCancel(ctx), true)
	// Renewals run on their own, so that the fences never wait for a
	// slow rebalance.
	rctx, stopRenewing := context.WithCancel(ctx)
	var renewing sync.WaitGroup
	renewing.Go(func() { r.renewLoop(rctx) })
	defer renewing.Wait()
	defer stopRenewing()
	balance := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer balance.Stop()
	sample := time.NewTicker(r.cfg.LagInterval)
	defer sample.Stop()
	retire := time.NewTicker(retireInterval)
	defer retire.Stop()
	for started := false; ; started = true {
		r.step(ctx)
		r.sample(ctx)
		if !started {
			r.retire(ctx) // once the first claims are made, not before them
		}
		for wait := true; wait; {
			select {
			case <-ctx.Done():
				return nil
			case <-sample.C:
				r.sample(ctx)
			case <-retire.C:
				r.retire(ctx)
			case <-balance.C:
				wait = false
			}
		}
	}
}
