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
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// tracer records the projections' spans through the global OpenTelemetry
// provider (a no-op unless the program installs one).
var tracer = otel.Tracer("github.com/orderd/orderd/projector")

// DefaultPartitions is how many partitions a projection's events are
// split into when RunnerConfig.Partitions is 0.
const DefaultPartitions = 16

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
	Owner      string // instance id this process reports as a partition's owner [host name and pid]
	BatchSize  int    // most messages folded per write round [256]
	// Writers is how many write rounds of this projection may be in
	// flight at once in this process, whatever the number of partitions it
	// holds [2]; a round writes the batches of every partition waiting
	// when it starts. A partition waiting for a round keeps receiving, so
	// its next batch is larger and the events of one stream in it fold
	// into one document write. On the embedded store's one writer, 2
	// rounds in flight gave a visible p99 of 71-83 ms and 0.66-0.68 of the
	// raw inserts in commands/s, 1 round 86-100 ms and 0.70-0.86
	// (docs/benchmarks.md, "Why two write rounds of a projection in
	// flight, shared by its partitions"). Raise it where the store takes
	// parallel writes (MongoDB).
	Writers       int
	MaxDeliveries int           // deliveries of a failing event before it is parked [5]
	AckWait       time.Duration // redelivery timeout of an unacknowledged message [30s]
	// PinnedTTL is how long JetStream keeps a partition pinned to a
	// process that sends no pull request [10s]: a process that dies loses
	// its partitions after it, and the processes pulling in its place get
	// them. A holder pulls again every PinnedTTL/4 (at least every
	// second, so at least 4s), and processes share the partitions, and
	// sample the lag of those they hold, every PinnedTTL/2.
	PinnedTTL time.Duration
	// Retired names projections that earlier versions of the service ran
	// and this one does not (projection.Retired): their consumers are
	// deleted once no process runs them.
	Retired []string
}

// feed is what every kind of projection a Runner feeds has.
type feed interface {
	// Name is the projection's name (projection.Definition.Name).
	Name() string
	// Version is the version of the definition this process folds
	// (projection.Definition.Ver, at least 1).
	Version() int
	// Pointer returns the projection's pointer document, read from the
	// store unless this process read it less than maxAge ago. Errors:
	// domain.ErrUnavailable.
	Pointer(ctx context.Context, maxAge time.Duration) (projection.Pointer, error)
	// EnsureIndexes creates the indexes of the collections it writes.
	EnsureIndexes(ctx context.Context) error
}

// Sequenced is a projection that takes every event of the stream in the
// order the relay published them, from one consumer (a rollup): its Apply
// gets the deliveries with their log positions and asks, with a
// *projection.GapError, for those it misses, which the Runner reads from
// the stream. projection.Rollup implements it.
type Sequenced interface {
	feed
	// Apply applies a run of deliveries sorted by stream sequence (see
	// projection.Rollup.Apply): what it did, the deliveries that cannot
	// be counted (by index), and an error: a *projection.GapError, or one
	// that may pass.
	Apply(ctx context.Context, ds []projection.Delivery) (projection.Outcome, map[int]error, error)
	// Lost records that the log positions of gap are neither delivered
	// nor in the stream: the collection it names cannot be trusted until
	// a build replaces it.
	Lost(ctx context.Context, gap *projection.GapError) error
	// Recount counts the events of a dead letter once, in the collection
	// readers read.
	Recount(ctx context.Context, id string, evs []domain.Event) error
}

// Projection is a read model as a Runner feeds it, whatever its document
// type. projection.Model[D] implements it, over the MongoDB adapter's
// storage.
type Projection interface {
	feed
	// Apply folds a delivery of events into the projection's collections
	// (fresh: read the documents instead of trusting a cache). It returns
	// what the batch did, the streams that could not be applied with their
	// errors, and a failure of the whole batch, such as
	// domain.ErrUnavailable, after which nothing is known to be written.
	Apply(ctx context.Context, events []domain.Event, fresh bool) (projection.Outcome, map[string]error, error)
}

// Runner feeds one projection from JetStream, split into partitions by
// stream id: partition p has its own durable pull consumer,
// "proj_<key>_p<NN>", with a pinned priority group: JetStream delivers a
// partition's messages to one pulling process at a time (the pinned
// client) and moves the pin to another puller once that one has sent no
// pull request for PinnedTTL. Every process running the projection pulls
// the partitions it holds, and, while it holds fewer than its share, every
// other one too; one above its share gives the excess back (balance).
// Events of one stream stay in one partition, so in order, and gap fills
// are rare. Correctness does not depend on one process per partition: a
// pin that moves while its last holder still writes, or a write that
// lands late, meets the read models' version guard (invariant 4).
//
// Within a partition, the worker takes the messages at hand (up to
// BatchSize), folds them with one read and one bulk write per round, and
// acknowledges a message only once its stream's document reflects it.
// Events that cannot be applied are redelivered with backoff and, after
// MaxDeliveries, parked in the dead-letter collection and terminated;
// failures that may pass (store down) are redelivered without limit.
type Runner struct {
	name    string
	key     string // the version's name for its consumers
	proj    feed
	store   Projection // a projection of one document per stream; nil for a Sequenced one
	seq     Sequenced  // a projection of the whole stream in order; nil for the others
	js      jetstream.JetStream
	dead    DeadLetterStore
	cfg     RunnerConfig
	log     *slog.Logger
	metrics *Metrics
	lastErr atomic.Pointer[string]
	writers chan struct{} // a slot per write round in flight (Writers)
	spacing time.Duration // the least time from one write round's start to the next's
	mu      sync.Mutex
	waiting []*waiting                        // batches no write round has taken yet
	began   time.Time                         // when the last write round began
	gaps    map[projection.GapError]time.Time // a Sequenced projection's gaps missing from the stream (by collection and first position), since when
	parts   []*partition
}

// NewRunner returns a Runner feeding the projection p, recording its
// metrics in m (nil: in a registry of its own, which nothing exposes).
func NewRunner(p Projection, js jetstream.JetStream, dead DeadLetterStore, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	r := newRunner(p, js, dead, cfg, log, m)
	r.store = p
	return r
}

// NewSequencedRunner returns a Runner feeding p with every event of the
// stream, in the order published, from one consumer, "proj_<key>", on the
// whole subject space: one partition, pinned to one process at a time
// like any other.
func NewSequencedRunner(p Sequenced, js jetstream.JetStream, dead DeadLetterStore, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	cfg.Partitions = 1
	r := newRunner(p, js, dead, cfg, log, m)
	r.seq, r.spacing = p, sequencedSpacing
	return r
}

func newRunner(p feed, js jetstream.JetStream, dead DeadLetterStore, cfg RunnerConfig, log *slog.Logger, m *Metrics) *Runner {
	cfg = cfg.WithDefaults()
	if m == nil {
		m = NewMetrics(prometheus.NewRegistry())
	}
	r := &Runner{name: p.Name(), key: projection.VersionKey(p.Name(), p.Version()), proj: p, js: js, dead: dead, cfg: cfg,
		log: log.With("projection", p.Name(), "version", p.Version()), metrics: m,
		writers: make(chan struct{}, cfg.Writers), gaps: map[projection.GapError]time.Time{}}
	for i := range cfg.Partitions {
		r.parts = append(r.parts, newPartition(i))
	}
	return r
}

// WithDefaults returns c with its zero fields set to the defaults in
// brackets, for a program that shows or checks them before NewRunner.
func (c RunnerConfig) WithDefaults() RunnerConfig {
	if c.Partitions <= 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d", host, os.Getpid())
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
	if c.PinnedTTL <= 0 {
		c.PinnedTTL = 10 * time.Second
	}
	return c
}

// Name is the projection's name.
func (r *Runner) Name() string { return r.name }

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

// ConsumerName is the durable consumer of partition p: "proj_<key>_p<NN>",
// where key is the projection's name for its first version;
// "proj_<key>" for a Sequenced projection's one consumer.
func (r *Runner) ConsumerName(p int) string { return r.consumerOf(r.key, p) }

// consumerOf is ConsumerName of the version whose key is key.
func (r *Runner) consumerOf(key string, p int) string {
	if r.seq != nil {
		return "proj_" + key
	}
	return fmt.Sprintf("proj_%s_p%02d", key, p)
}

// filterSubject is the subject filter of partition p: "<prefix>.<p>.>";
// "<prefix>.>" for a Sequenced projection.
func (r *Runner) filterSubject(p int) string {
	if r.seq != nil {
		return r.cfg.SubjectPrefix + ".>"
	}
	return fmt.Sprintf("%s.%d.>", r.cfg.SubjectPrefix, p)
}

// pinGroup is the priority group every process pulls a partition in.
const pinGroup = "projectors"

// consumer returns the durable consumer of partition p, creating or
// updating it only when it is missing or its settings differ: in a
// cluster, looking a consumer up is answered by its leader, while creating
// or updating one needs the meta leader, so a partition pulled during a
// meta-leader election still starts.
func (r *Runner) consumer(ctx context.Context, p int) (jetstream.Consumer, error) {
	want := jetstream.ConsumerConfig{
		Durable:        r.ConsumerName(p),
		FilterSubject:  r.filterSubject(p),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.cfg.AckWait,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		MaxDeliver:     -1,
		MaxAckPending:  maxAckPending(r.cfg.BatchSize),
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{pinGroup},
		PinnedTTL:      r.cfg.PinnedTTL,
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

// maxAckPending is a partition consumer's MaxAckPending: the batch being
// written and the pull's buffer behind it (PullMaxMessages is BatchSize).
// JetStream then delivers no more than the client can hold, also when the
// client pulls again from scratch after a reconnect with its buffer still
// full; more would be dropped by the client ("slow consumer") and come
// back only after AckWait.
func maxAckPending(batch int) int { return 2 * batch }

// sameConsumer reports whether have already holds every setting of want
// that Consumer sets.
func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	return have.Durable == want.Durable && have.FilterSubject == want.FilterSubject && len(have.FilterSubjects) == 0 &&
		have.AckPolicy == want.AckPolicy && have.AckWait == want.AckWait && have.DeliverPolicy == want.DeliverPolicy &&
		have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending &&
		have.PriorityPolicy == want.PriorityPolicy && len(have.PriorityGroups) == 1 && have.PriorityGroups[0] == pinGroup &&
		have.PinnedTTL == want.PinnedTTL
}

// retireInterval is how often a Runner looks for what the projection's
// other versions and the retired projections left.
const retireInterval = time.Minute

// Run ensures the indexes and the partitions' consumers, announces this
// process among the projection's members, and pulls the partitions until
// ctx is done, sharing them with the other members every PinnedTTL/2.
// It returns nil on cancellation, and an error only when it could not
// start (the caller restarts it): a partition whose consumer fails is
// restarted on its own, and the other partitions' workers go on.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.proj.EnsureIndexes(ctx); err != nil {
		return err
	}
	cons := make([]jetstream.Consumer, r.cfg.Partitions)
	for p := range r.cfg.Partitions {
		c, err := r.consumer(ctx, p)
		if err != nil {
			return err
		}
		cons[p] = c
	}
	// The projection's counters start at 0, so they are exposed before
	// anything happened and their first increase shows in rate() and
	// increase() (a series born at 1 looks unchanged).
	r.metrics.deadLetters.WithLabelValues(r.name)
	r.metrics.errors.WithLabelValues(r.name)
	r.metrics.owned.WithLabelValues(r.name)
	leave, err := r.join()
	if err != nil {
		return err
	}
	defer leave()
	var wg sync.WaitGroup
	for p, c := range cons {
		wg.Go(func() { r.consumePartition(ctx, r.parts[p], c) })
	}
	wg.Go(func() { r.loop(ctx) })
	wg.Wait()
	return nil
}

// loop shares the partitions and samples their lag, and retires what other
// versions left, until ctx is done.
func (r *Runner) loop(ctx context.Context) {
	balance := time.NewTicker(r.cfg.PinnedTTL / 2)
	defer balance.Stop()
	retire := time.NewTicker(retireInterval)
	defer retire.Stop()
	r.retire(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-balance.C:
			r.balance(ctx)
		case <-retire.C:
			r.retire(ctx)
		}
	}
}

// retire runs retireAll bounded by half the pinned TTL; a failure
// is logged and tried again at the next interval.
func (r *Runner) retire(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.PinnedTTL/2)
	defer cancel()
	if err := r.retireAll(rctx); err != nil && ctx.Err() == nil {
		r.log.Warn("projection versions not retired; trying again later", "err", err)
	}
}
