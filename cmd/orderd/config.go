package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// subjectPrefix is the subject space of order events: one subject per
// order stream, orders.events.<order id>.
const subjectPrefix = "orders.events"

// Config is read once, here: environment variables give the values, flags
// override them (bind lists each setting's variable and flag). Each
// component's settings are its own config struct, with the component's
// defaults (its WithDefaults); Run fills in what is wiring, not setting:
// the instance id as each component's Owner, the stream's name and
// partitions in the projectors' config, metrics and hooks. The embedded
// servers start when Mongo.URI or NATS.URL is empty, NATS only for roles
// that need it (roles.needsBus).
type Config struct {
	Roles      string // ORDERD_ROLES: api, relay, projector, jobs, comma-separated, or all
	InstanceID string // ORDERD_INSTANCE_ID: the owner of this instance's leases and claims
	HTTPAddr   string // ORDERD_HTTP_ADDR
	CacheSize  int    // ORDERD_CACHE_SIZE: streams whose state the API caches
	// MaxLag (ORDERD_MAX_LAG) is how many events the slowest read model
	// may be behind before the API refuses commands with 503 and
	// Retry-After; 0 takes commands whatever the lag.
	MaxLag int

	Log      LogConfig
	Mongo    MongoConfig
	NATS     NATSConfig
	Embedded EmbeddedConfig
	Tracing  TracingConfig

	// HTTP is the REST API's: AdminToken from ADMIN_TOKEN (environment
	// only, never a flag: flags show in ps); Run wires the rest.
	HTTP orderhttp.Config
	// Stream is the JetStream stream: Name (ORDERD_STREAM) and Replicas
	// (ORDERD_STREAM_REPLICAS); its partitions are Projector.Partitions.
	Stream bus.StreamConfig
	// Relay is the outbox relay's (the relay role tails the log under the
	// relay lease): LeaseTTL (ORDERD_RELAY_LEASE_TTL) and CatchUpMargin
	// (ORDERD_RELAY_CATCHUP_MARGIN).
	Relay outbox.Config
	// Projector is each projection runner's (the projector role):
	// Partitions (ORDERD_PROJECTION_PARTITIONS; every process of the
	// system must agree, README: changing the partition count), PinnedTTL
	// (ORDERD_PARTITION_PINNED_TTL) and Writers (ORDERD_PROJECTOR_WRITERS).
	Projector projector.RunnerConfig
	// Jobs is the repair-job worker's (the jobs role): Concurrency
	// (ORDERD_JOB_CONCURRENCY), LeaseTTL (ORDERD_JOB_LEASE_TTL),
	// BatchStreams (ORDERD_REBUILD_BATCH_STREAMS), MaxEventsPerSecond
	// (ORDERD_REBUILD_MAX_EVENTS_PER_SECOND, 0 is unpaced), Settle
	// (ORDERD_REBUILD_SETTLE) and Grace (ORDERD_REBUILD_GRACE).
	Jobs jobs.WorkerConfig

	// summaries is the order_summaries definition to run
	// [projection.OrderSummaries]; tests set one of another version to
	// play a deploy of a changed fold.
	summaries *projection.Definition[domain.Order]
}

// LogConfig is the logger's.
type LogConfig struct {
	Format string // ORDERD_LOG_FORMAT: text or json
	Level  string // ORDERD_LOG_LEVEL: debug, info, warn, error
}

// MongoConfig says which MongoDB holds the event log and the read models.
type MongoConfig struct {
	URI      string // MONGODB_URI; empty starts the embedded store
	Database string // MONGODB_DATABASE
}

// NATSConfig says which NATS server carries the events.
type NATSConfig struct {
	URL string // NATS_URL; empty starts the embedded NATS server for the roles that need one
}

// EmbeddedConfig is the embedded servers' (package internal/embedded):
// used for each of Mongo.URI and NATS.URL left empty.
type EmbeddedConfig struct {
	DataDir   string // ORDERD_DATA_DIR: their data, under store/ and nats/
	StoreAddr string // ORDERD_EMBEDDED_STORE_ADDR
	NATSAddr  string // ORDERD_EMBEDDED_NATS_ADDR
}

// TracingConfig turns tracing on.
type TracingConfig struct {
	// OTLPEndpoint is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT (the exporter reads the other OTEL_*
	// variables itself); empty: tracing off.
	OTLPEndpoint string
}

// DefaultConfig returns the defaults: everything on loopback, embedded
// servers on ports that do not clash with a NATS on 4222 or a MongoDB on
// 27017, and each component's own defaults.
func DefaultConfig() Config {
	return Config{
		Roles: "all", HTTPAddr: "127.0.0.1:8080", CacheSize: 100_000, MaxLag: 10_000,
		Log:      LogConfig{Format: "text", Level: "info"},
		Mongo:    MongoConfig{Database: "orderd"},
		Embedded: EmbeddedConfig{DataDir: cli.DefaultDataDir, StoreAddr: "127.0.0.1:27117", NATSAddr: "127.0.0.1:14222"},
		Stream: bus.StreamConfig{Name: "ORDERS", SubjectPrefix: subjectPrefix, Replicas: 1,
			Duplicates: 2 * time.Minute},
		Relay:     outbox.Config{}.WithDefaults(),
		Projector: projector.RunnerConfig{}.WithDefaults(),
		Jobs:      jobs.WorkerConfig{}.WithDefaults(),
	}
}

// bind lists each setting's variable, flag and help, in one place: it
// reads the variables through getenv into c and binds the flags to c.
func (c *Config) bind(fs *flag.FlagSet, getenv func(string) string) error {
	var errs []error
	str := func(p *string, env, name, usage string) {
		*p = cmp.Or(getenv(env), *p)
		fs.StringVar(p, name, *p, usage+" (env "+env+")")
	}
	num := func(p *int, env, name, usage string) {
		errs = append(errs, fromEnv(p, env, getenv(env), "number", strconv.Atoi))
		fs.IntVar(p, name, *p, usage+" (env "+env+")")
	}
	dur := func(p *time.Duration, env, name, usage string) {
		errs = append(errs, fromEnv(p, env, getenv(env), "duration", time.ParseDuration))
		fs.DurationVar(p, name, *p, usage+" (env "+env+")")
	}
	str(&c.HTTPAddr, "ORDERD_HTTP_ADDR", "http-addr", "REST API listen address")
	str(&c.Mongo.URI, "MONGODB_URI", "mongodb-uri", "MongoDB URI; empty starts the embedded store")
	str(&c.Mongo.Database, "MONGODB_DATABASE", "mongodb-database", "database name")
	str(&c.NATS.URL, "NATS_URL", "nats-url", "NATS URL; empty starts the embedded NATS server (the api role alone needs none)")
	str(&c.Embedded.DataDir, "ORDERD_DATA_DIR", "data-dir", "where the embedded servers keep their data; one server holds it at a time")
	str(&c.Roles, "ORDERD_ROLES", "roles", "roles of this process: api, relay, projector, jobs (comma-separated) or all")
	str(&c.InstanceID, "ORDERD_INSTANCE_ID", "instance-id", "instance id for leases (default: kept in the data dir on the embedded store, else host name and pid)")
	str(&c.Log.Format, "ORDERD_LOG_FORMAT", "log-format", "text or json")
	str(&c.Log.Level, "ORDERD_LOG_LEVEL", "log-level", "debug, info, warn or error")
	str(&c.Embedded.StoreAddr, "ORDERD_EMBEDDED_STORE_ADDR", "embedded-store-addr", "listen address of the embedded MongoDB-compatible store")
	str(&c.Embedded.NATSAddr, "ORDERD_EMBEDDED_NATS_ADDR", "embedded-nats-addr", "listen address of the embedded NATS server")
	str(&c.Stream.Name, "ORDERD_STREAM", "stream", "JetStream stream name")
	num(&c.Stream.Replicas, "ORDERD_STREAM_REPLICAS", "stream-replicas", "JetStream stream replicas (3 on a cluster)")
	num(&c.Projector.Writers, "ORDERD_PROJECTOR_WRITERS", "projector-writers", "write rounds of a projection in flight at once in this process, across its partitions (fewer writes fold more events each; raise it on MongoDB)")
	num(&c.Projector.Partitions, "ORDERD_PROJECTION_PARTITIONS", "projection-partitions", "partitions each projection's events are split into, shared by the projector processes; every process must agree (see README before changing it)")
	dur(&c.Projector.PinnedTTL, "ORDERD_PARTITION_PINNED_TTL", "partition-pinned-ttl", "how long JetStream keeps a projection partition pinned to a projector that stopped pulling; a dead projector's partitions move to the others after this")
	num(&c.CacheSize, "ORDERD_CACHE_SIZE", "cache-size", "order streams whose state the API keeps in memory")
	num(&c.MaxLag, "ORDERD_MAX_LAG", "max-lag", "events the slowest read model may be behind before commands are refused with 503 and Retry-After until it catches up; 0: never refuse")
	dur(&c.Relay.LeaseTTL, "ORDERD_RELAY_LEASE_TTL", "relay-lease-ttl", "lease of the relay that tails the log; another instance takes over within it when the relay dies")
	dur(&c.Relay.CatchUpMargin, "ORDERD_RELAY_CATCHUP_MARGIN", "relay-catchup-margin", "how far before its checkpoint a relay whose change stream cannot resume catches up from the log: more than the instances' clocks disagree plus the longest append")
	num(&c.Jobs.Concurrency, "ORDERD_JOB_CONCURRENCY", "job-concurrency", "repair-job tasks (rebuild partitions, verifications) this instance runs at once: a rebuild's partitions are scanned at the same time up to it")
	dur(&c.Jobs.LeaseTTL, "ORDERD_JOB_LEASE_TTL", "job-lease-ttl", "lease of a claimed job task; another instance resumes a task whose runner died after this")
	num(&c.Jobs.BatchStreams, "ORDERD_REBUILD_BATCH_STREAMS", "rebuild-batch-streams", "streams a rebuild writes between two checkpoints")
	errs = append(errs, fromEnv(&c.Jobs.MaxEventsPerSecond, "ORDERD_REBUILD_MAX_EVENTS_PER_SECOND",
		getenv("ORDERD_REBUILD_MAX_EVENTS_PER_SECOND"), "number", func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }))
	fs.Float64Var(&c.Jobs.MaxEventsPerSecond, "rebuild-max-events-per-second", c.Jobs.MaxEventsPerSecond,
		"pace of each rebuild partition, to spare the store; 0 is as fast as it goes (env ORDERD_REBUILD_MAX_EVENTS_PER_SECOND)")
	dur(&c.Jobs.Settle, "ORDERD_REBUILD_SETTLE", "rebuild-settle", "wait between announcing a rebuild's shadow collection and scanning; more than the projectors' pointer age (100ms), so every event the scan does not read reaches the shadow live")
	dur(&c.Jobs.Grace, "ORDERD_REBUILD_GRACE", "rebuild-grace", "how long a replaced read-model collection is kept, and fed by the projectors of its version, for a switch back before it is dropped")
	c.HTTP.AdminToken = getenv("ADMIN_TOKEN")
	c.Tracing.OTLPEndpoint = cmp.Or(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	return errors.Join(errs...)
}

// fromEnv sets *p to v, the value of the variable env, read by parse
// (numbers in decimal: strconv, where a flag takes any base); an unset
// variable leaves *p alone, a value parse refuses is an error that says
// what it wants.
func fromEnv[T any](p *T, env, v, what string, parse func(string) (T, error)) error {
	if v == "" {
		return nil
	}
	x, err := parse(v)
	if err != nil {
		return fmt.Errorf("%s=%q: not a %s", env, v, what)
	}
	*p = x
	return nil
}

// Validate reports every invalid setting.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.roles(); err != nil {
		errs = append(errs, err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log format %q: want text or json", c.Log.Format))
	}
	if c.Mongo.Database == "" || strings.ContainsAny(c.Mongo.Database, "/\\. \"$") {
		errs = append(errs, fmt.Errorf("database name %q is not valid", c.Mongo.Database))
	}
	if c.Stream.Replicas < 1 || c.Stream.Replicas > 5 {
		errs = append(errs, fmt.Errorf("stream replicas %d: want 1 to 5", c.Stream.Replicas))
	}
	if c.Projector.Writers < 1 || c.CacheSize < 0 || c.MaxLag < 0 || c.Relay.LeaseTTL < time.Second || c.Relay.CatchUpMargin <= 0 {
		errs = append(errs, errors.New("projector writers must be >= 1, cache size and max lag >= 0, relay lease TTL >= 1s, relay catch-up margin > 0"))
	}
	if c.Projector.Partitions < 1 || c.Projector.Partitions > 256 {
		errs = append(errs, fmt.Errorf("projection partitions %d: want 1 to 256", c.Projector.Partitions))
	}
	if c.Projector.PinnedTTL < 4*time.Second {
		errs = append(errs, fmt.Errorf("partition pinned TTL %v: want at least 4s (a holder pulls again every quarter of it, at least every second)", c.Projector.PinnedTTL))
	}
	j := c.Jobs
	if j.Concurrency < 1 || j.LeaseTTL < time.Second || j.BatchStreams < 1 || j.MaxEventsPerSecond < 0 || j.Grace < 0 {
		errs = append(errs, errors.New("job concurrency and rebuild batch must be >= 1, job lease TTL >= 1s, rebuild rate and grace >= 0"))
	}
	if j.Settle <= projection.WriterPointerAge {
		errs = append(errs, fmt.Errorf("rebuild settle %v: want more than the projectors' pointer age, %v", j.Settle, projection.WriterPointerAge))
	}
	return errors.Join(errs...)
}

type roles struct{ api, relay, projector, jobs bool }

// needsBus reports whether a role of r cannot work without NATS: the
// relay publishes the log, projectors consume, jobs republish (replays).
// The api role needs only the store: what it appends, the relay role
// publishes from the log.
func (r roles) needsBus() bool { return r.relay || r.projector || r.jobs }

func (c Config) roles() (roles, error) {
	var r roles
	for _, s := range strings.Split(c.Roles, ",") {
		switch strings.TrimSpace(s) {
		case "all":
			r = roles{true, true, true, true}
		case "api":
			r.api = true
		case "relay":
			r.relay = true
		case "projector":
			r.projector = true
		case "jobs":
			r.jobs = true
		default:
			return r, fmt.Errorf("role %q: want api, relay, projector, jobs or all", s)
		}
	}
	return r, nil
}

func (c Config) instanceID() string {
	if c.InstanceID != "" {
		return c.InstanceID
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}
