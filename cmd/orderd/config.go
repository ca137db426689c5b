package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is read once, here: environment variables give the values, flags
// override them. The embedded servers start when MONGODB_URI or NATS_URL is
// empty, NATS only for roles that need it (roles.needsBus).
type Config struct {
	HTTPAddr          string // ORDERD_HTTP_ADDR
	MongoURI          string // MONGODB_URI
	Database          string // MONGODB_DATABASE
	NATSURL           string // NATS_URL
	DataDir           string // ORDERD_DATA_DIR
	Roles             string // ORDERD_ROLES: api, relay, projector, jobs, comma-separated, or all
	InstanceID        string // ORDERD_INSTANCE_ID
	LogFormat         string // ORDERD_LOG_FORMAT: text or json
	LogLevel          string // ORDERD_LOG_LEVEL: debug, info, warn, error
	EmbeddedStoreAddr string // ORDERD_EMBEDDED_STORE_ADDR
	EmbeddedNATSAddr  string // ORDERD_EMBEDDED_NATS_ADDR
	Stream            string // ORDERD_STREAM
	StreamReplicas    int    // ORDERD_STREAM_REPLICAS
	ProjectorWorkers  int    // ORDERD_PROJECTOR_WORKERS
	ProjectorWriters  int    // ORDERD_PROJECTOR_WRITERS
	CacheSize         int    // ORDERD_CACHE_SIZE: streams whose state the API caches
	AdminToken        string // ADMIN_TOKEN (environment only, never a flag: flags show in ps)
	// OTLPEndpoint turns tracing on: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT (the exporter reads the other OTEL_*
	// variables itself).
	OTLPEndpoint string

	// Projection partitions (the projector role). Every process of the
	// system must agree on Partitions (README: changing the partition
	// count).
	Partitions   int           // ORDERD_PROJECTION_PARTITIONS
	PartitionTTL time.Duration // ORDERD_PARTITION_LEASE_TTL
	TenureLog    string        // ORDERD_TENURE_LOG: file each partition tenure's start and stop is appended to

	// The outbox sweep (the relay role): one instance at a time publishes
	// the commits an API instance left unpublished.
	RelaySweepInterval time.Duration // ORDERD_RELAY_SWEEP_INTERVAL
	RelaySweepGrace    time.Duration // ORDERD_RELAY_SWEEP_GRACE: age at which a commit counts as left behind

	// Repair jobs (the jobs role).
	JobConcurrency int           // ORDERD_JOB_CONCURRENCY: tasks one instance runs at once
	JobLeaseTTL    time.Duration // ORDERD_JOB_LEASE_TTL
	RebuildBatch   int           // ORDERD_REBUILD_BATCH_STREAMS: streams per checkpoint
	RebuildMaxRate float64       // ORDERD_REBUILD_MAX_EVENTS_PER_SECOND: 0 is unpaced
	RebuildSettle  time.Duration // ORDERD_REBUILD_SETTLE
	RebuildGrace   time.Duration // ORDERD_REBUILD_GRACE
}

// DefaultConfig returns the defaults: everything on loopback, embedded
// servers on ports that do not clash with a NATS on 4222 or a MongoDB on
// 27017.
func DefaultConfig() Config {
	return Config{
		HTTPAddr: "127.0.0.1:8080", Database: "orderd", DataDir: "./data", Roles: "all",
		LogFormat: "text", LogLevel: "info",
		EmbeddedStoreAddr: "127.0.0.1:27117", EmbeddedNATSAddr: "127.0.0.1:14222",
		Stream: "ORDERS", StreamReplicas: 1, ProjectorWorkers: 1, ProjectorWriters: 2, CacheSize: 100_000,
		Partitions: 16, PartitionTTL: 10 * time.Second,
		RelaySweepInterval: 5 * time.Second, RelaySweepGrace: 5 * time.Second,
		JobConcurrency: 1, JobLeaseTTL: 15 * time.Second, RebuildBatch: 500,
		RebuildSettle: 2 * time.Second, RebuildGrace: time.Minute,
	}
}

// env lists each setting's variable, flag and help, in one place.
func (c *Config) bind(fs *flag.FlagSet, getenv func(string) string) error {
	var errs []error
	str := func(p *string, env, name, usage string) {
		if v := getenv(env); v != "" {
			*p = v
		}
		fs.StringVar(p, name, *p, usage+" (env "+env+")")
	}
	num := func(p *int, env, name, usage string) {
		if v := getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: not a number", env, v))
			}
			*p = n
		}
		fs.IntVar(p, name, *p, usage+" (env "+env+")")
	}
	dur := func(p *time.Duration, env, name, usage string) {
		if v := getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: not a duration", env, v))
			}
			*p = d
		}
		fs.DurationVar(p, name, *p, usage+" (env "+env+")")
	}
	str(&c.HTTPAddr, "ORDERD_HTTP_ADDR", "http-addr", "REST API listen address")
	str(&c.MongoURI, "MONGODB_URI", "mongodb-uri", "MongoDB URI; empty starts the embedded store")
	str(&c.Database, "MONGODB_DATABASE", "mongodb-database", "database name")
	str(&c.NATSURL, "NATS_URL", "nats-url", "NATS URL; empty starts the embedded NATS server (the api role alone needs none)")
	str(&c.DataDir, "ORDERD_DATA_DIR", "data-dir", "where the embedded servers keep their data")
	str(&c.Roles, "ORDERD_ROLES", "roles", "roles of this process: api, relay, projector, jobs (comma-separated) or all")
	str(&c.InstanceID, "ORDERD_INSTANCE_ID", "instance-id", "instance id for leases (default: host name and pid)")
	str(&c.LogFormat, "ORDERD_LOG_FORMAT", "log-format", "text or json")
	str(&c.LogLevel, "ORDERD_LOG_LEVEL", "log-level", "debug, info, warn or error")
	str(&c.EmbeddedStoreAddr, "ORDERD_EMBEDDED_STORE_ADDR", "embedded-store-addr", "listen address of the embedded MongoDB-compatible store")
	str(&c.EmbeddedNATSAddr, "ORDERD_EMBEDDED_NATS_ADDR", "embedded-nats-addr", "listen address of the embedded NATS server")
	str(&c.Stream, "ORDERD_STREAM", "stream", "JetStream stream name")
	num(&c.StreamReplicas, "ORDERD_STREAM_REPLICAS", "stream-replicas", "JetStream stream replicas (3 on a cluster)")
	num(&c.ProjectorWorkers, "ORDERD_PROJECTOR_WORKERS", "projector-workers", "pull loops per partition this process owns (1 keeps each order's events in order, so gaps are rare)")
	num(&c.ProjectorWriters, "ORDERD_PROJECTOR_WRITERS", "projector-writers", "write rounds of a projection in flight at once in this process, across its partitions (fewer writes fold more events each; raise it on MongoDB)")
	num(&c.Partitions, "ORDERD_PROJECTION_PARTITIONS", "projection-partitions", "partitions each projection's events are split into, shared by the projector processes; every process must agree (see README before changing it)")
	dur(&c.PartitionTTL, "ORDERD_PARTITION_LEASE_TTL", "partition-lease-ttl", "lease of a projection partition and a projector's heartbeat; a dead projector's partitions are taken over after this")
	str(&c.TenureLog, "ORDERD_TENURE_LOG", "tenure-log", "file to append each partition tenure's start and stop to, one JSON line each (audits and tests); empty: none")
	num(&c.CacheSize, "ORDERD_CACHE_SIZE", "cache-size", "order streams whose state the API keeps in memory")
	dur(&c.RelaySweepInterval, "ORDERD_RELAY_SWEEP_INTERVAL", "relay-sweep-interval", "pause between two sweeps of the outbox for commits an instance left unpublished (each API instance publishes its own appends at once)")
	dur(&c.RelaySweepGrace, "ORDERD_RELAY_SWEEP_GRACE", "relay-sweep-grace", "age at which an unpublished commit is left to the sweep instead of its own instance")
	num(&c.JobConcurrency, "ORDERD_JOB_CONCURRENCY", "job-concurrency", "repair-job tasks (rebuild partitions, verifications) this instance runs at once")
	dur(&c.JobLeaseTTL, "ORDERD_JOB_LEASE_TTL", "job-lease-ttl", "lease of a claimed job task; another instance resumes a task whose runner died after this")
	num(&c.RebuildBatch, "ORDERD_REBUILD_BATCH_STREAMS", "rebuild-batch-streams", "streams a rebuild writes between two checkpoints")
	if v := getenv("ORDERD_REBUILD_MAX_EVENTS_PER_SECOND"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("ORDERD_REBUILD_MAX_EVENTS_PER_SECOND=%q: not a number", v))
		}
		c.RebuildMaxRate = f
	}
	fs.Float64Var(&c.RebuildMaxRate, "rebuild-max-events-per-second", c.RebuildMaxRate,
		"pace of each rebuild partition, to spare the store; 0 is as fast as it goes (env ORDERD_REBUILD_MAX_EVENTS_PER_SECOND)")
	dur(&c.RebuildSettle, "ORDERD_REBUILD_SETTLE", "rebuild-settle", "wait between announcing a rebuild's shadow collection and scanning (projectors pick it up within a batch)")
	dur(&c.RebuildGrace, "ORDERD_REBUILD_GRACE", "rebuild-grace", "how long a replaced read-model collection is kept before it is dropped")
	c.AdminToken = getenv("ADMIN_TOKEN")
	c.OTLPEndpoint = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if c.OTLPEndpoint == "" {
		c.OTLPEndpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	return errors.Join(errs...)
}

// Validate reports every invalid setting.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.roles(); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("log format %q: want text or json", c.LogFormat))
	}
	if c.Database == "" || strings.ContainsAny(c.Database, "/\\. \"$") {
		errs = append(errs, fmt.Errorf("database name %q is not valid", c.Database))
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("stream replicas %d: want 1 to 5", c.StreamReplicas))
	}
	if c.ProjectorWorkers < 1 || c.ProjectorWriters < 1 || c.CacheSize < 0 || c.RelaySweepInterval <= 0 || c.RelaySweepGrace <= 0 {
		errs = append(errs, errors.New("projector workers and writers must be >= 1, cache size >= 0, relay sweep interval and grace > 0"))
	}
	if c.Partitions < 1 || c.Partitions > 256 {
		errs = append(errs, fmt.Errorf("projection partitions %d: want 1 to 256", c.Partitions))
	}
	if c.PartitionTTL < time.Second {
		errs = append(errs, fmt.Errorf("partition lease TTL %v: want at least 1s", c.PartitionTTL))
	}
	if c.JobConcurrency < 1 || c.JobLeaseTTL < time.Second || c.RebuildBatch < 1 || c.RebuildMaxRate < 0 || c.RebuildSettle < 0 || c.RebuildGrace < 0 {
		errs = append(errs, errors.New("job concurrency and rebuild batch must be >= 1, job lease TTL >= 1s, rebuild rate, settle and grace >= 0"))
	}
	return errors.Join(errs...)
}

type roles struct{ api, relay, projector, jobs bool }

// needsBus reports whether a role of r cannot work without NATS: the
// relay sweeps the outbox, projectors consume, jobs republish (replays).
// The api role needs only the store: it publishes its own appends when it
// has a NATS connection, and what it cannot publish stays in the outbox
// for the relay role's sweep.
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
