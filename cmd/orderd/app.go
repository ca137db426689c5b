package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"golang.org/x/sync/errgroup"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/internal/pause"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/outbox"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
	"github.com/orderd/orderd/tracing"
)

// publishWindow is the most JetStream publishes awaiting their acks in one
// process: the relay's rounds in flight (up to 4 of 256 commits) fit when
// their commits hold two events on average (a command's commit holds one
// or two); beyond it a publish waits for room, within its round's ack
// timeout.
const publishWindow = 2048

// Main is the whole program: Run starts it, Close stops it in reverse start
// order. Tests boot it on port 0 with a temp data dir.
type Main struct {
	Config Config
	Log    *slog.Logger

	// HTTPAddr is the bound address of the HTTP server once Run has
	// returned: the API, or health, readiness and metrics only for an
	// instance without the api role.
	HTTPAddr string
	// Out receives the start-up summary of the embedded mode (NewMain:
	// os.Stderr).
	Out io.Writer

	stopEmbedded func()
	devToken     bool // the admin token is the development mode's own (devMode)
	// devStore is the embedded store (*embedded.Store) this process
	// started, nil on MongoDB; the benchmarks read its writer's costs.
	devStore    any
	stopTracing func(context.Context) error
	health      *roleHealth // the supervised roles' stops
	mongo       *mongo.Client
	nc          *nats.Conn
	ncClosed    chan struct{} // closed when nc has closed
	http        *orderhttp.Server
	cancel      context.CancelFunc
	group       *errgroup.Group
}

// NewMain returns a Main with the default config.
func NewMain() *Main {
	return &Main{Config: DefaultConfig(), Out: os.Stderr, stopEmbedded: func() {}}
}

// serveEnvOnly is the end of serve's help: the variables it reads that
// have no flag (a secret, and the OpenTelemetry exporter's own).
const serveEnvOnly = `
Environment only:
  ADMIN_TOKEN
    	bearer token of the admin routes (/v1/admin, the console) and of the
    	rebuild and verify commands; unset: the admin routes are off, except
    	with both servers embedded and -http-addr on loopback, which makes a
    	token kept in <data-dir>/admin-token and prints the console's link
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT
    	OTLP/HTTP endpoint traces are exported to; unset: no tracing
  OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, other OTEL_EXPORTER_OTLP_*
    	read by the OpenTelemetry OTLP/HTTP exporter as it documents
`

// ParseFlags reads the environment through getenv, then the flags. It
// returns flag.ErrHelp after printing the help for -h.
func (m *Main) ParseFlags(args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("orderd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: orderd serve [flags]\n\nRuns the service. With no MONGODB_URI and no NATS_URL it starts an embedded\nstore and NATS server keeping their data under -data-dir.\n\nFlags (each also read from the environment variable named):\n")
		fs.PrintDefaults()
		fmt.Fprint(stderr, serveEnvOnly)
	}
	if err := m.Config.bind(fs, getenv); err != nil {
		return err
	}
	return fs.Parse(args) // flag.ErrHelp after -h; Run validates the result
}

// Run connects to (or starts) the servers, ensures indexes, stream and
// consumers, and starts the configured roles. It returns once the HTTP
// server listens (every role has one: /readyz checks what the roles need,
// see readyChecks); the roles run until Close.
func (m *Main) Run(ctx context.Context) (err error) {
	c := &m.Config
	if err := c.Validate(); err != nil {
		return err
	}
	if m.Log == nil {
		m.Log = newLogger(c.Log.Format, c.Log.Level, os.Stderr)
	}
	r, _ := c.roles()
	// The data dir first: a second server on a dir in use, with the same
	// environment, would otherwise be told that the first one's port is
	// taken, and sent to move it.
	lock, err := lockEmbedded(c)
	if err != nil {
		return err
	}
	var ln net.Listener
	defer func() {
		if err != nil {
			lock.release() // nil once startEmbedded has taken it
			if ln != nil {
				_ = ln.Close()
			}
		}
	}()
	// Bound before anything slow starts, so a port in use is said at once.
	if ln, err = listen(c.HTTPAddr, "ORDERD_HTTP_ADDR", "-http-addr"); err != nil {
		return err
	}
	if err := lock.setHTTP(ln.Addr().String()); err != nil {
		return err
	}
	if m.stopTracing, err = startTracing(ctx, *c); err != nil {
		return err
	}
	embeddedStore, embeddedNATS := c.Mongo.URI == "", c.NATS.URL == "" && r.needsBus()
	err = m.startEmbedded(lock)
	lock = nil // released by startEmbedded's failure, or by m.stopEmbedded
	if err != nil {
		return err
	}
	w, err := m.setup(ctx, r)
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	m.group, runCtx = errgroup.WithContext(runCtx)
	m.startRoles(runCtx, r, w)
	ready := readyChecks(r, w.reach.Ready, m.busConnected, m.health)
	if r.api {
		m.http = m.startAPI(runCtx, w, ready)
	} else {
		// Health, readiness and metrics only, so that probes and scrapers
		// see every role.
		m.http = orderhttp.NewServer(orderhttp.Config{OpsOnly: true, Ready: ready, Gatherer: w.reg, Registerer: w.reg,
			Log: m.Log.With("component", "http")})
	}
	m.HTTPAddr = ln.Addr().String()
	m.group.Go(func() error { return m.http.Serve(ln) })
	if r.api && c.HTTP.AdminToken == "" {
		m.Log.Info("admin routes are off: set ADMIN_TOKEN to turn them on")
	}
	if embeddedStore || embeddedNATS {
		m.printEmbedded(embeddedStore, embeddedNATS)
	}
	m.Log.Info("orderd started", "roles", c.Roles, "http", "http://"+m.HTTPAddr, "mongodb_uri", redact(c.Mongo.URI),
		"nats_url", redact(c.NATS.URL), "instance", c.instanceID(), "tracing", c.Tracing.OTLPEndpoint != "")
	return nil
}

// wiring is what Run's shared setup makes for the roles.
type wiring struct {
	db     *mongo.Database
	reach  *mongodb.Reachability
	js     jetstream.JetStream // nil without NATS_URL
	reg    *prometheus.Registry
	stream bus.StreamConfig
	store  *mongodb.EventStore

	pointers  *mongodb.Pointers
	dead      *mongodb.DeadLetters
	sums      *projection.Model[domain.Order]
	sales     *projection.Rollup
	runners   []*projector.Runner
	scheduler *jobs.Jobs
	jm        *jobs.Metrics
	// relayLease is the relay's lease, for this instance: the relay role
	// holds it, the daily sales and the admin API read where the relay
	// has published up to.
	relayLease *mongodb.Lease
}

// setup is what every role shares: the connections, the metrics, the
// stream (for the roles that use it), the log's indexes and the read
// models.
func (m *Main) setup(ctx context.Context, r roles) (*wiring, error) {
	c := &m.Config
	w := &wiring{}
	var err error
	if w.db, w.reach, err = m.connectStore(ctx); err != nil {
		return nil, err
	}
	if w.js, err = m.connectBus(ctx, r); err != nil {
		return nil, err
	}
	w.reg = prometheus.NewRegistry()
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.health = newRoleHealth(w.reg)
	storeMetrics := mongodb.NewEventStoreMetrics(w.reg)
	// The stream splits the events into the partitions the projectors
	// consume: one setting for both.
	w.stream = c.Stream
	w.stream.Partitions = c.Projector.Partitions

	setupCtx, cancelSetup := context.WithTimeout(ctx, 60*time.Second)
	defer cancelSetup()
	// Only the roles that use the stream wait for it: the relay, a
	// projector or a jobs instance creates it.
	if r.needsBus() {
		if err := bus.EnsureStream(setupCtx, w.js, w.stream); err != nil {
			return nil, err
		}
	}
	w.store = mongodb.NewEventStore(w.db, mongodb.WithMetrics(storeMetrics))
	if err := w.store.EnsureIndexes(setupCtx); err != nil {
		return nil, err
	}
	if err := m.setupReadModels(setupCtx, w); err != nil {
		return nil, err
	}
	return w, nil
}

// connectStore connects to the store and waits for its answer.
func (m *Main) connectStore(ctx context.Context) (*mongo.Database, *mongodb.Reachability, error) {
	c := &m.Config
	// Majority writes and reads; a wait in server selection long enough
	// for an election, and a prompt 503 while every member is down (see
	// mongodb.ClientOptions and Reachability).
	reach := mongodb.NewReachability()
	m.Log.Info("connecting to the store", "url", redact(c.Mongo.URI))
	var err error
	m.mongo, err = mongo.Connect(mongodb.ClientOptions(c.Mongo.URI).SetServerMonitor(reach.ServerMonitor()))
	if err != nil {
		return nil, nil, fmt.Errorf("store %s: %w; check MONGODB_URI (-mongodb-uri)", redact(c.Mongo.URI), err)
	}
	// A store that does not answer is said at start, with what to change,
	// rather than by the first command or index build.
	pingCtx, cancelPing := context.WithTimeout(ctx, connectWait)
	err = m.mongo.Ping(pingCtx, nil)
	cancelPing()
	if err != nil {
		return nil, nil, fmt.Errorf("store %s not reachable within %v: %w; check MONGODB_URI (-mongodb-uri)", redact(c.Mongo.URI), connectWait, err)
	}
	return m.mongo.Database(c.Mongo.Database), reach, nil
}

// connectBus connects to NATS. An api-only instance does not wait for
// NATS (RetryOnFailedConnect): it starts and takes commands while NATS is
// down; it uses NATS to sample the read models' lag (admission) and show
// consumer lag on the admin API. Without NATS_URL it has no connection at
// all (js is nil). The roles that need the bus wait for the connection, up
// to connectWait, and fail the start without it, with what to change.
func (m *Main) connectBus(ctx context.Context, r roles) (jetstream.JetStream, error) {
	c := &m.Config
	if c.NATS.URL == "" {
		return nil, nil
	}
	natsLog := m.Log.With("component", "nats")
	m.Log.Info("connecting to NATS", "url", redact(c.NATS.URL), "required", r.needsBus())
	var failed atomic.Pointer[error] // the error of the last attempt to connect that failed
	var err error
	m.ncClosed = make(chan struct{})
	m.nc, err = nats.Connect(c.NATS.URL, nats.Name("orderd "+c.instanceID()), nats.MaxReconnects(-1),
		nats.ClosedHandler(func(*nats.Conn) { close(m.ncClosed) }),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { failed.Store(&err) }),
		// The client's asynchronous errors in the service's log, with
		// the subscription's subject, instead of its own line on
		// stderr. A pull consumer's messages dropped as a slow
		// consumer come back after the consumer's AckWait.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			natsLog.Warn("nats client error", "subject", subject, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("NATS %s: %w; check NATS_URL (-nats-url)", redact(c.NATS.URL), err)
	}
	// The roles that need the bus wait up to connectWait for the first
	// connection, which RetryOnFailedConnect makes in the background.
	deadline := time.Now().Add(connectWait)
	for r.needsBus() && !m.nc.IsConnected() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			why := cmp.Or(ctx.Err(), errors.New("no answer"))
			if last := failed.Load(); ctx.Err() == nil && last != nil {
				why = *last
			}
			return nil, fmt.Errorf("NATS %s not reachable within %v: %w; check NATS_URL (-nats-url)", redact(c.NATS.URL), connectWait, why)
		}
		pause.For(ctx, 50*time.Millisecond)
	}
	// Acks the relay gave up on must not stay pending in the client; the
	// window bounds the relay's (and replays') publishes awaiting acks.
	js, err := jetstream.New(m.nc, jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncMaxPending(publishWindow))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nil
}

// setupReadModels makes the read models, their projector runners and the
// jobs that build them; every role uses some of them.
func (m *Main) setupReadModels(setupCtx context.Context, w *wiring) error {
	c := &m.Config
	db := w.db
	pm := projection.NewMetrics(w.reg)
	rm := projector.NewMetrics(w.reg)
	w.jm = jobs.NewMetrics(w.reg)
	w.pointers = mongodb.NewPointers(db)
	sumsDef := projection.OrderSummaries
	if c.summaries != nil {
		sumsDef = *c.summaries
	}
	w.sums = mongodb.NewProjection(db, sumsDef, w.store, pm, w.pointers)
	// Every process agrees on what readers read before any of them
	// serves or feeds a read model (a projection new to a log is built
	// first, by a jobs instance).
	// The daily sales start where the relay has published up to when a
	// build starts them; the instances' clocks may disagree by up to the
	// relay's catch-up margin.
	w.relayLease = mongodb.NewLease(db, outbox.RelayLease, c.instanceID(), c.Relay.WithDefaults().LeaseTTL)
	w.sales = projection.NewRollup(projection.DailySales, mongodb.NewRollups(db), w.store, pm, w.pointers, w.relayLease,
		c.Relay.WithDefaults().CatchUpMargin)
	if err := w.pointers.Ensure(setupCtx, w.sums.Name(), w.sums.Collection(), w.sums.Version()); err != nil {
		return err
	}
	if err := w.pointers.Ensure(setupCtx, w.sales.Name(), w.sales.Collection(), w.sales.Version()); err != nil {
		return err
	}
	if err := mongodb.DropUnused(setupCtx, db); err != nil {
		return err
	}
	w.dead = mongodb.NewDeadLetters(db)
	// Each projection is split into partitions shared by the projector
	// processes, each partition pinned to one of them by JetStream.
	rc := c.Projector
	rc.Stream, rc.SubjectPrefix, rc.Owner = w.stream.Name, w.stream.SubjectPrefix, c.instanceID()
	rc.Retired = projection.Retired
	plog := m.Log.With("component", "projector")
	w.runners = []*projector.Runner{projector.NewRunner(w.sums, w.js, w.dead, rc, plog, rm),
		projector.NewSequencedRunner(w.sales, w.js, w.dead, rc, plog, rm)}
	w.scheduler = jobs.New(mongodb.NewJobs(db), w.pointers, w.store, w.sums, w.sales)
	return nil
}

// startRoles starts the supervised roles of r: the relay (one relay at a
// time tails the log under the relay lease; the others stand by), the
// projector (a runner per projection) and the jobs worker (which builds,
// rebuilds and verifies read models).
func (m *Main) startRoles(ctx context.Context, r roles, w *wiring) {
	c := &m.Config
	if r.relay {
		rc := c.Relay
		rc.Owner = c.instanceID()
		relay := outbox.NewRelay(w.store, tracing.NewPublisher(bus.NewPublisher(w.js, w.stream)), w.relayLease, rc,
			m.Log.With("component", "relay"), outbox.NewMetrics(w.reg))
		m.group.Go(func() error { return m.supervise(ctx, "relay", "", relay.Run) })
	}
	if r.projector {
		for _, pr := range w.runners {
			m.group.Go(func() error { return m.supervise(ctx, "projector", pr.Name(), pr.Run) })
		}
	}
	if r.jobs {
		jc := c.Jobs
		jc.Owner, jc.Metrics, jc.Retired = c.instanceID(), w.jm, projection.Retired
		jw := jobs.NewWorker(w.scheduler, w.store, bus.NewPublisher(w.js, w.stream).Republish, jc, m.Log)
		m.group.Go(func() error { return m.supervise(ctx, "jobs", "", jw.Run) })
	}
}

// startAPI starts what the api role runs beside its HTTP server (the
// console's history, the lag watch of admission) and returns the server.
func (m *Main) startAPI(runCtx context.Context, w *wiring, ready map[string]orderhttp.Check) *orderhttp.Server {
	c := &m.Config
	var cache domain.StateCache
	if c.CacheSize > 0 {
		cache, _ = lru.New[string, domain.Order](c.CacheSize) // refuses only a size below 1
	}
	svc := domain.NewService(tracing.NewEventStore(w.store), cache)
	// Random ids: the log is range-sharded by stream_id (only a ranged
	// shard key keeps its unique indexes), and time-ordered ids would
	// send every new order to the top chunk (deployments/sharding.md).
	svc.NewID = uuid.NewString
	hc := c.HTTP
	hc.Commands, hc.ReadModels = svc, mongodb.NewReader(w.db, w.pointers, w.sales)
	adminSvc := admin.New(admin.Config{Jobs: w.scheduler, DeadLetters: w.dead, Runners: w.runners,
		ReadModels: []admin.ReadModel{w.sums}, Bus: w.js != nil, Relay: w.relayLease, Log: w.store, Metrics: w.reg})
	hc.Admin = adminSvc
	if c.HTTP.AdminToken != "" {
		// The console's first screen shows the last hour from these
		// samples; without the admin routes nobody reads them.
		m.group.Go(func() error { return adminSvc.RunHistory(runCtx) })
	}
	hc.Ready, hc.Store, hc.Gatherer, hc.Registerer, hc.Log = ready, w.reach, w.reg, w.reg, m.Log.With("component", "http")
	if w.js != nil && c.MaxLag > 0 {
		watch := projector.NewLagWatch(w.runners, time.Second, m.Log.With("component", "admission"))
		m.group.Go(func() error { return watch.Run(runCtx) })
		hc.Lag, hc.MaxLag = watch, c.MaxLag
	}
	return orderhttp.NewServer(hc)
}

// connectWait bounds the wait for the store and, for the roles that need
// it, NATS at start: longer than a replica set's election (10-12 s).
const connectWait = 15 * time.Second

// printEmbedded tells a newcomer what the embedded mode started, where its
// data lives and how to reach it.
func (m *Main) printEmbedded(store, bus bool) {
	c, out := m.Config, m.Out
	dir, err := filepath.Abs(c.Embedded.DataDir)
	if err != nil {
		dir = c.Embedded.DataDir
	}
	fmt.Fprintf(out, "\norderd is running in embedded mode (roles: %s); its data lives under %s\n", c.Roles, dir)
	if r, _ := c.roles(); r.api {
		fmt.Fprintf(out, "  REST API         http://%s   (try: curl http://%s/readyz)\n", m.HTTPAddr, m.HTTPAddr)
	} else {
		fmt.Fprintf(out, "  health           http://%s/readyz   (no api role: health, readiness and metrics only)\n", m.HTTPAddr)
	}
	if store {
		fmt.Fprintf(out, "  event store      %s   FerretDB on SQLite, files in %s; open it with mongosh\n",
			redact(c.Mongo.URI), filepath.Join(dir, "store"))
	}
	if bus {
		fmt.Fprintf(out, "  NATS JetStream   %s   files in %s\n", c.NATS.URL, filepath.Join(dir, "nats"))
	}
	switch {
	case c.HTTP.AdminToken == "":
		fmt.Fprintf(out, "  admin API        off: start with ADMIN_TOKEN set to rebuild, verify or see status\n")
	case m.devToken:
		if r, _ := c.roles(); r.api {
			fmt.Fprintf(out, "  console          http://%s/console/#token=%s\n", m.HTTPAddr, c.HTTP.AdminToken)
		}
		fmt.Fprintf(out, "  admin API        on, with this data dir's token (in %s),\n", filepath.Join(dir, "admin-token"))
		fmt.Fprintf(out, "                   which orderd status, rebuild and verify read there when ADMIN_TOKEN is unset;\n")
		fmt.Fprintf(out, "                   from another directory: -data-dir %s, or export ADMIN_TOKEN=%s\n", dir, c.HTTP.AdminToken)
	default:
		fmt.Fprintf(out, "  admin API        on: Authorization: Bearer $ADMIN_TOKEN (orderd status, orderd rebuild, orderd verify)\n")
	}
	fmt.Fprintf(out, "Stop with Ctrl-C; the data stays for the next start.\n\n")
}

// Close stops the roles and disconnects, in reverse start order: the HTTP
// server drains its requests, the relay and projection workers stop, NATS
// drains, MongoDB disconnects, the embedded servers stop.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var errs []error
	if m.http != nil {
		errs = append(errs, m.http.Shutdown(ctx))
	}
	if m.cancel != nil {
		m.cancel()
	}
	if m.group != nil {
		if err := m.group.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if m.nc != nil {
		// Drain closes a connection that is reconnecting (NATS down) at
		// once, with nothing to drain: not an error of the shutdown.
		if err := m.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrConnectionReconnecting) {
			errs = append(errs, err)
		}
		// Drain returns at once; the connection closes once its
		// subscriptions are drained (nats.DrainTimeout bounds it).
		select {
		case <-m.ncClosed:
		case <-ctx.Done():
		}
	}
	if m.mongo != nil {
		errs = append(errs, m.mongo.Disconnect(ctx))
	}
	m.stopEmbedded()
	if m.stopTracing != nil {
		errs = append(errs, m.stopTracing(ctx))
	}
	return errors.Join(errs...)
}

func newLogger(format, level string, w io.Writer) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// listen binds addr, the value of the variable env (flag flag); a port in
// use is an error that names the port and what moves it.
func listen(addr, env, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_, port, _ := net.SplitHostPort(addr)
		return nil, fmt.Errorf("port %s (%s) is not free; set %s or %s to another address: %w", port, addr, env, flag, err)
	}
	return ln, nil
}
