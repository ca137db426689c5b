package admin

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// Config is what a Service works on.
type Config struct {
	Jobs        *jobs.Jobs
	DeadLetters DeadLetters
	// Runners are the projections' runners, whether or not this instance
	// runs them: they read the partitions' leases and the consumers' lag.
	Runners []*projector.Runner
	// ReadModels are the projections the order page compares with the log.
	ReadModels []ReadModel
	// Bus is false on an instance without a NATS connection (an api-only
	// instance without NATS_URL): there is no consumer lag to show.
	Bus bool
	// Relay reads the relay's lease and checkpoint: the MongoDB adapter's
	// *mongodb.Lease of the relay lease implements it. Required by
	// Relay and the history.
	Relay Relay
	// Log is the event log the log browser pages and tails. Required by
	// Browse, LogCommit and TailLog.
	Log Log
	// Metrics, when set, is this process's registry: the history reads
	// the relay's catch-ups from it (orderd_relay_catchups_total) when
	// this process runs the relay.
	Metrics prometheus.Gatherer
}

// Relay is the outbox relay's state as the store holds it: its lease and
// checkpoint. Errors: domain.ErrUnavailable.
type Relay interface {
	Status(ctx context.Context) (outbox.RelayStatus, error)
}

// DeadLetters lists the parked events of a projection (all with ""), up to
// limit, and counts them (jobs.DeadLetterCounter): the MongoDB adapter's
// *mongodb.DeadLetters implements it. Errors: domain.ErrUnavailable.
type DeadLetters interface {
	jobs.DeadLetterCounter
	List(ctx context.Context, projection string, limit int64) ([]projector.DeadLetter, error)
}

// ReadModel is a projection as the order page of the console sees it:
// projection.Model implements it.
type ReadModel interface {
	// Check compares the document of stream id with the fold of its log.
	// Errors: domain.ErrUnavailable.
	Check(ctx context.Context, id string) (projection.ReadModelCheck, error)
}

// Service is the admin side of the REST API (orderhttp.Admin): the repair
// jobs, the projections' state and the dead letters. The repair jobs'
// starts are its Jobs' (StartRebuild, StartVerify, StartReplay), the log
// browser's pages and commits its Log's (Browse, LogCommit).
type Service struct {
	*jobs.Jobs
	Log
	cfg     Config
	tail    tail
	history history
}

// New returns the admin service over cfg.
func New(cfg Config) *Service {
	return &Service{Jobs: cfg.Jobs, Log: cfg.Log, cfg: cfg}
}

// SwitchBack points readers of projection back at the collection the last
// switch replaced (jobs.Jobs.SwitchBack) and returns the projection's
// state after it.
func (a *Service) SwitchBack(ctx context.Context, projection string) (ProjectionStatus, error) {
	if _, err := a.cfg.Jobs.SwitchBack(ctx, projection); err != nil {
		return ProjectionStatus{}, err
	}
	list, err := a.Projections(ctx)
	if err != nil {
		return ProjectionStatus{}, err
	}
	for _, p := range list {
		if p.Name == projection {
			return p, nil
		}
	}
	return ProjectionStatus{}, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
}

func (a *Service) Job(ctx context.Context, id string) (jobs.Job, error) {
	if err := domain.ValidateID("job id", id); err != nil {
		return jobs.Job{}, fmt.Errorf("%v: %w", err, domain.ErrNotFound)
	}
	return a.cfg.Jobs.Get(ctx, id)
}

func (a *Service) CancelJob(ctx context.Context, id string) (jobs.Job, error) {
	if _, err := a.Job(ctx, id); err != nil {
		return jobs.Job{}, err
	}
	return a.cfg.Jobs.Cancel(ctx, id)
}

// ProjectionStatus is one projection as GET /v1/admin/projections shows
// it: its read models and jobs (jobs.ProjectionStatus), and its
// partitions as JetStream and the projectors answer.
type ProjectionStatus struct {
	jobs.ProjectionStatus
	// Partitions are the projection's partitions, in order, each
	// delivered to one process at a time.
	Partitions []projector.PartitionStatus `json:"partitions,omitempty"`
	// AckFloor is how many deliveries the projection's consumers have
	// acknowledged, summed over its partitions (each consumer's ack floor),
	// nil when unknown. Its change over time is the projection's apply
	// rate in events per second.
	AckFloor *uint64 `json:"ack_floor"`
}

// Projections adds to each projection's state (jobs.Jobs.Status) its
// partitions: owner and apply rate from the projectors' roll call, pin
// and lag from JetStream; and the lag of the consumers feeding the active
// collection and a shadow being built, each of its own version.
func (a *Service) Projections(ctx context.Context) ([]ProjectionStatus, error) {
	states, err := a.cfg.Jobs.Status(ctx, a.cfg.DeadLetters, func(ctx context.Context, name string) (*uint64, string) {
		r := a.runner(name)
		if r == nil {
			return nil, ""
		}
		if !a.cfg.Bus {
			return nil, "consumer: unknown, this instance has no NATS_URL"
		}
		n, err := r.Lag(ctx)
		if err != nil {
			return nil, "consumer: " + err.Error()
		}
		return &n, r.LastError()
	})
	if err != nil {
		return nil, err
	}
	list := make([]ProjectionStatus, len(states))
	for i, p := range states {
		list[i].ProjectionStatus = p
		r := a.runner(p.Name)
		if r == nil || !a.cfg.Bus {
			continue
		}
		list[i].Partitions = r.PartitionStatus(ctx)
		if n, err := r.AckFloor(ctx); err == nil {
			list[i].AckFloor = &n
		}
		list[i].ConsumerLagVersion = p.Version
		// The collection readers read and a shadow being built are fed by
		// the consumers of their own versions, which during a deploy are
		// not this instance's.
		lagOf := func(v int) *uint64 {
			if v == p.Version {
				return p.ConsumerLag
			}
			n, err := r.VersionLag(ctx, v)
			if err != nil {
				return nil
			}
			return &n
		}
		if p.ActiveVersion > 0 {
			list[i].ActiveLag = lagOf(p.ActiveVersion)
		}
		if p.ShadowVersion > 0 {
			list[i].ShadowLag = lagOf(p.ShadowVersion)
		}
	}
	return list, nil
}

func (a *Service) runner(name string) *projector.Runner {
	for _, r := range a.cfg.Runners {
		if r.Name() == name {
			return r
		}
	}
	return nil
}

// Relay returns the relay's owner, lease and checkpoint (zero before any
// relay started).
func (a *Service) Relay(ctx context.Context) (outbox.RelayStatus, error) {
	return a.cfg.Relay.Status(ctx)
}

func (a *Service) DeadLetters(ctx context.Context, projection string, limit int64) ([]projector.DeadLetter, error) {
	if projection != "" && a.runner(projection) == nil {
		return nil, fmt.Errorf("projection %q: %w", projection, domain.ErrNotFound)
	}
	return a.cfg.DeadLetters.List(ctx, projection, limit)
}

func (a *Service) RetryDeadLetter(ctx context.Context, id string) error {
	name, _, _ := strings.Cut(id, ":")
	r := a.runner(name)
	if r == nil || len(id) > 256 {
		return fmt.Errorf("dead letter %q: %w", id, domain.ErrNotFound)
	}
	return r.Retry(ctx, id)
}

func (a *Service) ReadModels(ctx context.Context, orderID string) ([]projection.ReadModelCheck, error) {
	out := make([]projection.ReadModelCheck, 0, len(a.cfg.ReadModels))
	known := false
	for _, p := range a.cfg.ReadModels {
		c, err := p.Check(ctx, orderID)
		if err != nil {
			return nil, err
		}
		known = known || c.StoredVersion > 0 || c.LogVersion > 0 || c.FoldError != "" ||
			c.State != "equal" && c.State != "not-built" && c.State != "other-version"
		out = append(out, c)
	}
	if !known {
		return nil, fmt.Errorf("order %s: %w", orderID, domain.ErrNotFound)
	}
	return out, nil
}
