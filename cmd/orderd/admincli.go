package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/orderd/orderd/domain"
)

// Defaults of the admin subcommands' flags.
const (
	adminDefaultURL      = "http://127.0.0.1:8080"
	adminDefaultTokenEnv = "ADMIN_TOKEN"
	adminDefaultInterval = time.Second
	adminRequestTimeout  = 30 * time.Second
	// adminPollFailures is how many polls in a row may fail (no answer, or
	// a 5xx) before waiting gives up.
	adminPollFailures = 5
	// progressEvery is how often the progress line is printed when stderr
	// is not a terminal.
	progressEvery = 5 * time.Second
)

const rebuildUsage = `Usage: orderd rebuild <projection> [flags]

Rebuilds a read model (projection) from the event log, without downtime:
the service folds every order stream into a new "shadow" collection, which
the live projectors also keep up to date meanwhile, checks the shadow
against the log (verify before switch), and then switches reads to it. The
old collection is dropped after a grace period (ORDERD_REBUILD_GRACE).
Only one rebuild of a projection runs at a time.

Projections: order_summaries, customer_order_stats.

The command talks to the admin API of a running service. Both sides need
the same token: start the service with ADMIN_TOKEN set (without it the
admin routes are off), and set ADMIN_TOKEN in this shell too. The token is
read from the environment only, never from a flag (flags show in ps).

Examples:
  export ADMIN_TOKEN=...                                # the server's token
  orderd rebuild order_summaries                        start, print the job id, return
  orderd rebuild order_summaries -wait -partitions 4    start and follow until it ends
  orderd rebuild order_summaries -cancel <job-id>       ask a running rebuild to stop

With -wait a progress line goes to stderr and a summary to stdout; the exit
status is 0 only when the rebuild succeeded. Ctrl-C stops waiting but not
the rebuild, which keeps running on the server. -cancel stops it: the
active collection then stays as it was.

Flags:
`

const verifyUsage = `Usage: orderd verify <projection> [flags]

Checks a read model (projection) against the event log: the service folds
every order stream again and compares the result with the documents of the
active collection. It counts documents that are missing, stale (at an older
version), extra (no such stream) or different, and prints them as a table
with a few examples and two digests (of the read model and of the log's
fold: equal exactly when nothing drifted). With -repair the documents that
differ are rewritten from the log (extra ones deleted).

Projections: order_summaries, customer_order_stats.

The command talks to the admin API of a running service. Both sides need
the same token: start the service with ADMIN_TOKEN set (without it the
admin routes are off), and set ADMIN_TOKEN in this shell too. The token is
read from the environment only, never from a flag (flags show in ps).

Examples:
  export ADMIN_TOKEN=...                     # the server's token
  orderd verify order_summaries              report drift, change nothing
  orderd verify order_summaries -repair      report drift and repair it

The command waits for the job, with a progress line on stderr. The exit
status is 0 when nothing drifted or everything that drifted was repaired,
and non-zero otherwise (or when the job failed), so scripts can use it.
Ctrl-C stops waiting but not the job.

Flags:
`

// adminOptions are the flags the admin subcommands share.
type adminOptions struct {
	url      string
	tokenEnv string
	interval time.Duration
}

func (o *adminOptions) bind(fs *flag.FlagSet, getenv func(string) string) {
	o.bindConn(fs, getenv)
	fs.DurationVar(&o.interval, "interval", adminDefaultInterval, "how often the job is polled while waiting")
}

// bindConn binds only the flags that say where the service is and where
// the token is (-url, -token-env), for subcommands that wait for no job;
// the interval keeps its default.
func (o *adminOptions) bindConn(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&o.url, "url", cmp.Or(getenv("ORDERD_URL"), adminDefaultURL), "base `URL` of the orderd service; env ORDERD_URL sets the default")
	fs.StringVar(&o.tokenEnv, "token-env", adminDefaultTokenEnv, "`name` of the environment variable holding the admin token")
	o.interval = adminDefaultInterval
}

// client checks the options and returns the admin API client of cmd.
func (o *adminOptions) client(cmd string, getenv func(string) string) (*adminClient, error) {
	base := strings.TrimRight(o.url, "/")
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: -url %q: want http://host:port", cmd, o.url)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("%s: -interval must be positive", cmd)
	}
	if o.tokenEnv == "" {
		return nil, fmt.Errorf("%s: -token-env must name an environment variable", cmd)
	}
	token := strings.TrimSpace(getenv(o.tokenEnv))
	if token == "" {
		how := "set ADMIN_TOKEN to the token the service was started with"
		if o.tokenEnv != adminDefaultTokenEnv {
			how = fmt.Sprintf("set %s (named by -token-env) to the service's ADMIN_TOKEN", o.tokenEnv)
		}
		return nil, fmt.Errorf("%s: no admin token: %s (it is read from the environment only, never from a flag)", cmd, how)
	}
	return &adminClient{cmd: cmd, base: base, token: token, tokenEnv: o.tokenEnv,
		hc: &http.Client{Timeout: adminRequestTimeout}}, nil
}

// parseInterspersed parses fs from args, allowing positional arguments
// before, between and after the flags, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// parseProjection parses fs from args (flags before or after the
// positional argument) and returns the one positional argument, the
// projection. It returns flag.ErrHelp for -h, and an error naming fs's
// command for no projection or extra arguments.
func parseProjection(fs *flag.FlagSet, args []string) (string, error) {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return "", err
	}
	cmd := fs.Name()
	switch {
	case len(pos) == 0:
		return "", fmt.Errorf("%s: name the projection, e.g. orderd %s order_summaries (see -h)", cmd, cmd)
	case len(pos) > 1:
		return "", fmt.Errorf("%s: unexpected arguments %q (see -h)", cmd, pos[1:])
	}
	return pos[0], nil
}

// rebuildMain runs "orderd rebuild": args are the arguments after the
// subcommand, getenv reads the environment. The job id and summary go to
// stdout; usage, progress and hints to stderr. It returns nil for -h and
// for a rebuild that was started (or, with -wait, that succeeded).
func rebuildMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rebuild", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), rebuildUsage); fs.PrintDefaults() }
	var o adminOptions
	o.bind(fs, getenv)
	partitions := fs.Int("partitions", 0, "split the scan of the log into `N` partitions (1 to 64) that the service's job runners work on in parallel; 0 leaves it to the service (1)")
	wait := fs.Bool("wait", false, "follow the job until it ends, print a summary, and exit non-zero unless it succeeded")
	cancelID := fs.String("cancel", "", "do not start a rebuild: ask the running rebuild `job-id` to stop (with -wait, follow it until it has stopped)")
	name, err := parseProjection(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if *partitions < 0 || *partitions > domain.MaxPartitions {
		return fmt.Errorf("rebuild: -partitions %d: must be 1 to %d (or 0 for the service's default)", *partitions, domain.MaxPartitions)
	}
	c, err := o.client("rebuild", getenv)
	if err != nil {
		return err
	}
	c.projection = name
	jobsPath := "/v1/admin/projections/" + url.PathEscape(name) + "/rebuilds"

	var job domain.Job
	if *cancelID != "" {
		if *partitions != 0 {
			return errors.New("rebuild: -partitions does not go with -cancel")
		}
		if _, err := c.do(ctx, http.MethodPost, jobsPath+"/"+url.PathEscape(*cancelID)+"/cancel", nil, &job); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "cancel requested for rebuild %s of %s (now %s)\n", job.ID, name, job.State)
		fmt.Fprintln(stdout, "It stops at its next checkpoint; the active collection stays as it was.")
	} else {
		var body any = struct{}{}
		if *partitions > 0 {
			body = map[string]int{"partitions": *partitions}
		}
		loc, err := c.do(ctx, http.MethodPost, jobsPath, body, &job)
		if err != nil {
			return c.unknownProjection(ctx, err)
		}
		fmt.Fprintf(stdout, "rebuild of %s started: job %s (partitions %d, shadow collection %s)\n",
			name, job.ID, job.Partitions, job.Shadow)
		fmt.Fprintf(stdout, "job: %s\n", c.url(cmp.Or(loc, jobsPath+"/"+job.ID)))
		if !*wait {
			fmt.Fprintf(stdout, "follow it with a GET of that URL (Authorization: Bearer $%s); stop it with: orderd rebuild %s -cancel %s\n",
				c.tokenEnv, name, job.ID)
			return nil
		}
	}
	if !*wait {
		return nil
	}
	job, err = c.wait(ctx, jobsPath+"/"+url.PathEscape(job.ID), job, o.interval, newProgress(stderr, "rebuild"))
	if err != nil {
		return err
	}
	active := c.activeCollection(ctx, name)
	if active == "" && job.State == domain.StateSucceeded {
		active = job.Shadow // the switch made it active
	}
	if err := printRebuild(stdout, job, active); err != nil {
		return err
	}
	switch {
	case *cancelID != "" && job.State == domain.StateCanceled:
		return nil
	case job.State != domain.StateSucceeded:
		return fmt.Errorf("rebuild: job %s ended %s%s", job.ID, job.State, suffix(": ", job.Error))
	}
	return nil
}

// verifyMain runs "orderd verify", like rebuildMain. The report goes to
// stdout. It returns nil for -h and when the job succeeded with no drift
// left unrepaired.
func verifyMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), verifyUsage); fs.PrintDefaults() }
	var o adminOptions
	o.bind(fs, getenv)
	repair := fs.Bool("repair", false, "rewrite the documents that differ from the log (and delete extra ones)")
	name, err := parseProjection(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	c, err := o.client("verify", getenv)
	if err != nil {
		return err
	}
	jobsPath := "/v1/admin/projections/" + url.PathEscape(name) + "/verifications"
	var job domain.Job
	if _, err := c.do(ctx, http.MethodPost, jobsPath, map[string]bool{"repair": *repair}, &job); err != nil {
		return c.unknownProjection(ctx, err)
	}
	fmt.Fprintf(stderr, "verify of %s started: job %s\n", name, job.ID)
	job, err = c.wait(ctx, jobsPath+"/"+url.PathEscape(job.ID), job, o.interval, newProgress(stderr, "verify"))
	if err != nil {
		return err
	}
	mode := "report only"
	if job.Repair {
		mode = "repair"
	}
	fmt.Fprintf(stdout, "verify of %s (%s): job %s %s\n", name, mode, job.ID, job.State)
	if job.State != domain.StateSucceeded || job.Report == nil {
		return fmt.Errorf("verify: job %s ended %s%s", job.ID, job.State, suffix(": ", job.Error))
	}
	rep := job.Report
	if err := printVerifyReport(stdout, rep); err != nil {
		return err
	}
	left := rep.Drift() - rep.Repaired
	switch {
	case rep.Drift() == 0:
		fmt.Fprintln(stdout, "result: OK, the read model equals the fold of the log")
	case left <= 0:
		fmt.Fprintf(stdout, "result: REPAIRED %d documents; run verify again to confirm\n", rep.Repaired)
	default:
		fmt.Fprintf(stdout, "result: DRIFT, %d documents differ from the log\n", left)
		hint := "; run with -repair to rewrite them from the log"
		if job.Repair {
			hint = ""
		}
		return fmt.Errorf("verify: %d documents of %s differ from the event log%s", left, rep.Collection, hint)
	}
	return nil
}

// printVerifyReport writes a verify report as an aligned table, then its
// examples.
func printVerifyReport(w io.Writer, rep *domain.VerifyReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", k, v) }
	row("collection", rep.Collection)
	row("missing", rep.Missing)
	row("stale", rep.Stale)
	row("extra", rep.Extra)
	row("different", rep.Different)
	row("drift", rep.Drift())
	row("repaired", rep.Repaired)
	row("documents", rep.Documents)
	row("streams", rep.Streams)
	row("events", rep.Events)
	row("poison streams", rep.PoisonStreams)
	row("digest", cmp.Or(rep.Digest, "-"))
	row("expected digest", cmp.Or(rep.ExpectedDigest, "-"))
	match := "no"
	if rep.Digest == rep.ExpectedDigest {
		match = "yes"
	}
	if rep.Repaired > 0 {
		match += " (the digest was read before the repair)"
	}
	row("digests match", match)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Examples) == 0 {
		return nil
	}
	fmt.Fprintln(w, "examples:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KIND\tID\tSTORED VERSION\tLOG VERSION\tFIELDS")
	for _, e := range rep.Examples {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", e.Kind, e.ID, e.StoredVersion, e.LogVersion, cmp.Or(strings.Join(e.Fields, ","), "-"))
	}
	return tw.Flush()
}

// printRebuild writes the summary of a finished rebuild.
func printRebuild(w io.Writer, job domain.Job, active string) error {
	duration := "-"
	if !job.FinishedAt.IsZero() {
		duration = job.FinishedAt.Sub(job.CreatedAt).Round(time.Millisecond).String()
		if !job.StartedAt.IsZero() {
			duration += " (scanning " + job.FinishedAt.Sub(job.StartedAt).Round(time.Millisecond).String() + ")"
		}
	}
	fmt.Fprintf(w, "rebuild %s of %s: %s\n", job.ID, job.Projection, job.State)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", k, v) }
	if job.Error != "" {
		row("error", job.Error)
	}
	row("events", job.Events)
	row("streams", job.Streams)
	row("poison streams", job.PoisonStreams)
	row("partitions", job.Partitions)
	row("duration", duration)
	row("events/s", fmt.Sprintf("%.0f", job.RatePerSecond))
	row("shadow collection", cmp.Or(job.Shadow, "-"))
	row("active collection", cmp.Or(active, "(unknown)"))
	if err := tw.Flush(); err != nil {
		return err
	}
	if job.Report != nil {
		fmt.Fprintln(w, "verify before switch (of the shadow collection, repaired in place):")
		return printVerifyReport(w, job.Report)
	}
	return nil
}

func suffix(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// adminClient calls the admin REST API with the bearer token.
type adminClient struct {
	cmd        string // subcommand, the prefix of errors
	projection string // for hints
	base       string
	token      string
	tokenEnv   string
	hc         *http.Client
}

func (c *adminClient) url(path string) string { return c.base + path }

// adminError is an answer other than 2xx.
type adminError struct {
	cmd     string
	status  int
	typ     string // problem type, "" when the body was no problem document
	title   string
	detail  string
	fields  []string
	hint    string
	retries bool // worth polling again (5xx)
}

func (e *adminError) Error() string {
	var b strings.Builder
	b.WriteString(e.cmd + ": ")
	if e.typ == "" {
		fmt.Fprintf(&b, "unexpected answer: %s", cmp.Or(e.detail, http.StatusText(e.status)))
	} else {
		b.WriteString(cmp.Or(e.title, http.StatusText(e.status)))
		if e.detail != "" {
			b.WriteString(": " + e.detail)
		}
		if len(e.fields) > 0 {
			b.WriteString(" (" + strings.Join(e.fields, "; ") + ")")
		}
	}
	fmt.Fprintf(&b, " (HTTP %d)", e.status)
	if e.hint != "" {
		b.WriteString("\n  hint: " + e.hint)
	}
	return b.String()
}

// do sends one request with body as JSON (nil sends none) and decodes a
// 2xx answer into out. It returns the Location header. Answers other than
// 2xx are *adminError.
func (c *adminClient) do(ctx context.Context, method, path string, body, out any) (string, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return "", err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), rd)
	if err != nil {
		return "", fmt.Errorf("%s: %w", c.cmd, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("%s: no answer from %s: %w\n  hint: is orderd running there? Set -url or ORDERD_URL", c.cmd, c.base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", fmt.Errorf("%s: %s %s: reading the answer: %w", c.cmd, method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", c.problem(resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return "", fmt.Errorf("%s: %s %s: decoding the answer: %w", c.cmd, method, path, err)
		}
	}
	return resp.Header.Get("Location"), nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// problem reads an error answer, an RFC 9457 problem document when it
// is one, and adds a hint for the usual mistakes.
func (c *adminClient) problem(status int, body []byte) *adminError {
	e := &adminError{cmd: c.cmd, status: status, retries: status >= 500}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
		Errors []struct {
			Field  string `json:"field"`
			Detail string `json:"detail"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &p) == nil && p.Type != "" {
		e.typ, e.title, e.detail = p.Type, p.Title, p.Detail
		for _, f := range p.Errors {
			e.fields = append(e.fields, f.Field+": "+f.Detail)
		}
	} else {
		d := strings.TrimSpace(string(body))
		if len(d) > 200 {
			d = d[:200] + "..."
		}
		e.detail = d
	}
	switch {
	case status == http.StatusUnauthorized:
		e.hint = fmt.Sprintf("the token in $%s is not the server's ADMIN_TOKEN; set %s to the token orderd was started with", c.tokenEnv, c.tokenEnv)
	case status == http.StatusNotFound && (e.typ == "/problems/route" || e.typ == ""):
		e.hint = "the server has no admin routes: it was started without ADMIN_TOKEN, so they are off. " +
			"Restart it with ADMIN_TOKEN set (or check -url)"
	case e.typ == "/problems/job-running":
		e.hint = fmt.Sprintf("wait for that rebuild to end, or stop it with: orderd rebuild %s -cancel <job-id>", cmp.Or(c.projection, "<projection>"))
	}
	return e
}

// unknownProjection adds the names of the projections to a not-found
// answer to a start request (the only thing it can be about).
func (c *adminClient) unknownProjection(ctx context.Context, err error) error {
	var ae *adminError
	if !errors.As(err, &ae) || ae.status != http.StatusNotFound || ae.typ != "/problems/not-found" {
		return err
	}
	list, lerr := c.projectionStatus(ctx)
	if lerr != nil || len(list) == 0 {
		return err
	}
	var names []string
	for _, p := range list {
		names = append(names, p.Name)
	}
	ae.hint = "the projections are " + strings.Join(names, ", ")
	return ae
}

// activeCollection returns the projection's active collection as the
// service reports it, or "" when it cannot be read.
func (c *adminClient) activeCollection(ctx context.Context, name string) string {
	list, err := c.projectionStatus(ctx)
	if err != nil {
		return ""
	}
	for _, p := range list {
		if p.Name == name {
			return p.ActiveCollection
		}
	}
	return ""
}

// wait polls the job at path every interval until it is final, showing
// progress. When ctx ends it stops waiting (the job keeps running), says
// how to follow the job, and returns an error.
func (c *adminClient) wait(ctx context.Context, path string, job domain.Job, interval time.Duration, p *progress) (domain.Job, error) {
	p.show(job)
	t := time.NewTicker(interval)
	defer t.Stop()
	failures := 0
	for !job.State.Final() {
		select {
		case <-ctx.Done():
			return job, c.stoppedWaiting(p, path, job)
		case <-t.C:
		}
		var next domain.Job
		_, err := c.do(ctx, http.MethodGet, path, nil, &next)
		if ctx.Err() != nil {
			return job, c.stoppedWaiting(p, path, job)
		}
		if err != nil {
			var ae *adminError
			if errors.As(err, &ae) && !ae.retries {
				p.end()
				return job, err
			}
			if failures++; failures >= adminPollFailures {
				p.end()
				return job, fmt.Errorf("%w\n  (gave up after %d failed polls; job %s may still be running)", err, failures, job.ID)
			}
			p.note(fmt.Sprintf("poll failed (%d of %d), retrying: %v", failures, adminPollFailures, firstLine(err.Error())))
			continue
		}
		failures = 0
		job = next
		p.show(job)
	}
	p.end()
	return job, nil
}

func (c *adminClient) stoppedWaiting(p *progress, path string, job domain.Job) error {
	p.end()
	w := p.w
	fmt.Fprintf(w, "Stopped waiting. The %s job %s keeps running on the server (was %s).\n", job.Kind, job.ID, job.State)
	fmt.Fprintf(w, "  check it:  curl -H \"Authorization: Bearer $%s\" %s\n", c.tokenEnv, c.url(path))
	if job.Kind == domain.KindRebuild {
		fmt.Fprintf(w, "  stop it:   orderd rebuild %s -cancel %s\n", job.Projection, job.ID)
	}
	return fmt.Errorf("%s: stopped waiting for job %s, which keeps running", c.cmd, job.ID)
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// progress shows a job's progress on one line: redrawn in place on a
// terminal, otherwise printed when the state changes and every
// progressEvery.
type progress struct {
	w         io.Writer
	kind      string
	tty       bool
	drawn     int // width of the line on screen (tty), 0 when none
	last      time.Time
	lastState domain.JobState
	now       func() time.Time
}

func newProgress(w io.Writer, kind string) *progress {
	return &progress{w: w, kind: kind, tty: isTerminal(w), now: time.Now}
}

// isTerminal reports whether w is a terminal (not /dev/null, a pipe or a
// file), where the progress line may redraw itself.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (p *progress) line(j domain.Job) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d streams, %d events", p.kind, j.State, j.Streams, j.Events)
	if j.RatePerSecond > 0 {
		fmt.Fprintf(&b, ", %.0f events/s", j.RatePerSecond)
	}
	if j.ETASeconds > 0 {
		fmt.Fprintf(&b, ", ETA %s", (time.Duration(j.ETASeconds * float64(time.Second))).Round(time.Second))
	}
	if j.PoisonStreams > 0 {
		fmt.Fprintf(&b, ", %d poison streams", j.PoisonStreams)
	}
	if j.CancelRequested && !j.State.Final() {
		b.WriteString(", cancel requested")
	}
	return b.String()
}

func (p *progress) show(j domain.Job) {
	s := p.line(j)
	if p.tty {
		pad := max(p.drawn-len(s), 0)
		fmt.Fprintf(p.w, "\r%s%s", s, strings.Repeat(" ", pad))
		p.drawn = len(s)
		return
	}
	now := p.now()
	if j.State != p.lastState || now.Sub(p.last) >= progressEvery {
		fmt.Fprintln(p.w, s)
		p.last, p.lastState = now, j.State
	}
}

// note prints a message on a line of its own.
func (p *progress) note(msg string) {
	p.end()
	fmt.Fprintln(p.w, msg)
}

// end finishes the line being redrawn.
func (p *progress) end() {
	if p.tty && p.drawn > 0 {
		fmt.Fprintln(p.w)
		p.drawn = 0
	}
}
