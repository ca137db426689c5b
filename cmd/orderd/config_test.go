package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projector"
)

// configSettings names every setting: its environment variable, its flag
// (none for the environment-only ones), a value and where that value must
// land in a Config.
var configSettings = []struct {
	env, flag, value string
	got              func(Config) any
	want             any
}{
	{"ORDERD_HTTP_ADDR", "http-addr", "0.0.0.0:9000", func(c Config) any { return c.HTTPAddr }, "0.0.0.0:9000"},
	{"MONGODB_URI", "mongodb-uri", "mongodb://db:27017/", func(c Config) any { return c.Mongo.URI }, "mongodb://db:27017/"},
	{"MONGODB_DATABASE", "mongodb-database", "orders2", func(c Config) any { return c.Mongo.Database }, "orders2"},
	{"NATS_URL", "nats-url", "nats://n:4222", func(c Config) any { return c.NATS.URL }, "nats://n:4222"},
	{"ORDERD_DATA_DIR", "data-dir", "/var/lib/orderd", func(c Config) any { return c.Embedded.DataDir }, "/var/lib/orderd"},
	{"ORDERD_ROLES", "roles", "api,relay", func(c Config) any { return c.Roles }, "api,relay"},
	{"ORDERD_INSTANCE_ID", "instance-id", "node-7", func(c Config) any { return c.InstanceID }, "node-7"},
	{"ORDERD_LOG_FORMAT", "log-format", "json", func(c Config) any { return c.Log.Format }, "json"},
	{"ORDERD_LOG_LEVEL", "log-level", "debug", func(c Config) any { return c.Log.Level }, "debug"},
	{"ORDERD_EMBEDDED_STORE_ADDR", "embedded-store-addr", "127.0.0.1:1", func(c Config) any { return c.Embedded.StoreAddr }, "127.0.0.1:1"},
	{"ORDERD_EMBEDDED_NATS_ADDR", "embedded-nats-addr", "127.0.0.1:2", func(c Config) any { return c.Embedded.NATSAddr }, "127.0.0.1:2"},
	{"ORDERD_STREAM", "stream", "ORDERS2", func(c Config) any { return c.Stream.Name }, "ORDERS2"},
	{"ORDERD_STREAM_REPLICAS", "stream-replicas", "3", func(c Config) any { return c.Stream.Replicas }, 3},
	{"ORDERD_PROJECTOR_WRITERS", "projector-writers", "5", func(c Config) any { return c.Projector.Writers }, 5},
	{"ORDERD_PROJECTION_PARTITIONS", "projection-partitions", "32", func(c Config) any { return c.Projector.Partitions }, 32},
	{"ORDERD_PARTITION_PINNED_TTL", "partition-pinned-ttl", "7s", func(c Config) any { return c.Projector.PinnedTTL }, 7 * time.Second},
	{"ORDERD_CACHE_SIZE", "cache-size", "10", func(c Config) any { return c.CacheSize }, 10},
	{"ORDERD_MAX_LAG", "max-lag", "250", func(c Config) any { return c.MaxLag }, 250},
	{"ORDERD_RELAY_LEASE_TTL", "relay-lease-ttl", "3s", func(c Config) any { return c.Relay.LeaseTTL }, 3 * time.Second},
	{"ORDERD_RELAY_CATCHUP_MARGIN", "relay-catchup-margin", "4s", func(c Config) any { return c.Relay.CatchUpMargin }, 4 * time.Second},
	{"ORDERD_JOB_CONCURRENCY", "job-concurrency", "6", func(c Config) any { return c.Jobs.Concurrency }, 6},
	{"ORDERD_JOB_LEASE_TTL", "job-lease-ttl", "20s", func(c Config) any { return c.Jobs.LeaseTTL }, 20 * time.Second},
	{"ORDERD_REBUILD_BATCH_STREAMS", "rebuild-batch-streams", "100", func(c Config) any { return c.Jobs.BatchStreams }, 100},
	{"ORDERD_REBUILD_MAX_EVENTS_PER_SECOND", "rebuild-max-events-per-second", "2500.5", func(c Config) any { return c.Jobs.MaxEventsPerSecond }, 2500.5},
	{"ORDERD_REBUILD_SETTLE", "rebuild-settle", "1s", func(c Config) any { return c.Jobs.Settle }, time.Second},
	{"ORDERD_REBUILD_GRACE", "rebuild-grace", "2m", func(c Config) any { return c.Jobs.Grace }, 2 * time.Minute},
	{"ADMIN_TOKEN", "", "s3cret", func(c Config) any { return c.HTTP.AdminToken }, "s3cret"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "http://otel:4318", func(c Config) any { return c.Tracing.OTLPEndpoint }, "http://otel:4318"},
	{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "http://otel:4318/v1/traces", func(c Config) any { return c.Tracing.OTLPEndpoint }, "http://otel:4318/v1/traces"},
}

// TestConfigNames: every environment variable and every flag of serve
// lands in its field of the nested Config, and a flag overrides its
// variable.
func TestConfigNames(t *testing.T) {
	for _, s := range configSettings {
		c := DefaultConfig()
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		if err := c.bind(fs, func(k string) string {
			if k == s.env {
				return s.value
			}
			return ""
		}); err != nil {
			t.Fatalf("%s=%s: %v", s.env, s.value, err)
		}
		if got := s.got(c); got != s.want {
			t.Errorf("%s=%s: field is %v, want %v", s.env, s.value, got, s.want)
		}
		if s.flag == "" {
			if fs.Lookup(strings.ToLower(strings.ReplaceAll(s.env, "_", "-"))) != nil {
				t.Errorf("%s is a flag too: secrets and OTEL_* are read from the environment only", s.env)
			}
			continue
		}
		c = DefaultConfig()
		fs = flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		env := map[string]string{s.env: "not-" + s.value}
		_ = c.bind(fs, func(k string) string { return env[k] }) // "not-3" is not a number: the flag overrides it
		if err := fs.Parse([]string{"-" + s.flag, s.value}); err != nil {
			t.Fatalf("-%s %s: %v", s.flag, s.value, err)
		}
		if got := s.got(c); got != s.want {
			t.Errorf("-%s %s over %s: field is %v, want %v", s.flag, s.value, s.env, got, s.want)
		}
	}

	// Every flag serve has is one of the settings above.
	c := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	if err := c.bind(fs, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range configSettings {
		known[s.flag] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !known[f.Name] {
			t.Errorf("flag -%s is not in configSettings", f.Name)
		}
	})
}

// TestConfigDefaults: the defaults a component takes when left unset are
// the ones serve starts it with, so a setting has one default.
func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults are not valid: %v", err)
	}
	if !reflect.DeepEqual(c.Projector, projector.RunnerConfig{}.WithDefaults()) {
		t.Errorf("projector defaults %+v, want the projector's own %+v", c.Projector, projector.RunnerConfig{}.WithDefaults())
	}
	if c.Projector.Writers != 2 || c.Projector.Partitions != projector.DefaultPartitions ||
		c.Projector.PinnedTTL != 10*time.Second {
		t.Errorf("projector defaults %+v: want 2 writers, %d partitions, a 10s pin", c.Projector, projector.DefaultPartitions)
	}
	if c.Relay != (outbox.Config{}).WithDefaults() || c.Relay.LeaseTTL != outbox.DefaultLeaseTTL {
		t.Errorf("relay defaults %+v, want the outbox's own", c.Relay)
	}
	if !reflect.DeepEqual(c.Jobs, (jobs.WorkerConfig{}).WithDefaults()) || c.Jobs.Concurrency != jobs.DefaultConcurrency || c.Jobs.BatchStreams != 500 {
		t.Errorf("job defaults %+v, want the jobs worker's own", c.Jobs)
	}
	if c.Stream.SubjectPrefix != subjectPrefix || c.Stream.Name != "ORDERS" || c.Stream.Replicas != 1 || c.Stream.Duplicates != 2*time.Minute {
		t.Errorf("stream defaults %+v", c.Stream)
	}
}

// TestConfigValidate reports each invalid nested setting.
func TestConfigValidate(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"roles":           func(c *Config) { c.Roles = "api,web" },
		"log format":      func(c *Config) { c.Log.Format = "xml" },
		"database":        func(c *Config) { c.Mongo.Database = "a.b" },
		"stream replicas": func(c *Config) { c.Stream.Replicas = 7 },
		"writers":         func(c *Config) { c.Projector.Writers = 0 },
		"partitions":      func(c *Config) { c.Projector.Partitions = 257 },
		"partition pin":   func(c *Config) { c.Projector.PinnedTTL = 3 * time.Second },
		"relay lease TTL": func(c *Config) { c.Relay.LeaseTTL = 0 },
		"job lease":       func(c *Config) { c.Jobs.LeaseTTL = time.Millisecond },
		"rebuild rate":    func(c *Config) { c.Jobs.MaxEventsPerSecond = -1 },
		"rebuild settle":  func(c *Config) { c.Jobs.Settle = 50 * time.Millisecond },
	} {
		c := DefaultConfig()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
}
