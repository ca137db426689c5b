package operator

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/jobs"
)

// Defaults of the admin subcommands' flags.
const (
	adminDefaultInterval = time.Second
	adminRequestTimeout  = 30 * time.Second
	// adminPollFailures is how many polls in a row may fail (no answer, or
	// a 5xx) before waiting gives up.
	adminPollFailures = 5
)

// adminUsage is what the usage of rebuild and verify says about the
// projections and about the token both sides need.
const adminUsage = `Projection: order_summaries (customer stats and daily sales are summed from it).

The command talks to the admin API of a running service. Both sides need
the same token: start the service with ADMIN_TOKEN set (without it the
admin routes are off), and set ADMIN_TOKEN in this shell too. The token is
read from the environment only, never from a flag (flags show in ps). A
server in the development mode (both servers embedded, as make run starts
it) makes its own token and keeps it in <data-dir>/admin-token: with
ADMIN_TOKEN, MONGODB_URI and NATS_URL unset, the command reads it there.
`

// parse binds to fs the flags the admin subcommands share: -url,
// -data-dir, and -interval when poll (the subcommand waits for jobs). It
// parses args into fs, finds the admin token, and returns fs's subcommand
// at work: on the projection named by the one positional argument when
// named, else with none allowed. For -h it returns a nil command and no
// error.
func parse(fs *flag.FlagSet, args []string, getenv func(string) string, poll, named bool) (*command, error) {
	cmd := fs.Name()
	op := &command{cmd: cmd, tokenShell: "$ADMIN_TOKEN", interval: adminDefaultInterval}
	var serviceURL, dataDir string
	fs.StringVar(&serviceURL, "url", cli.ServiceURL(getenv), "base `URL` of the orderd service; default: ORDERD_URL, else where ORDERD_HTTP_ADDR makes the server listen")
	fs.StringVar(&dataDir, "data-dir", cmp.Or(getenv("ORDERD_DATA_DIR"), cli.DefaultDataDir),
		"data `dir` of a server in the development mode (embedded servers, as make run starts it), whose admin token <dir>/admin-token is used when ADMIN_TOKEN, MONGODB_URI and NATS_URL are unset; default: ORDERD_DATA_DIR, else "+cli.DefaultDataDir)
	if poll {
		fs.DurationVar(&op.interval, "interval", adminDefaultInterval, "how often the job is polled while waiting")
	}
	pos, err := parseInterspersed(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil, nil
	case err != nil:
		return nil, err
	case !named && len(pos) > 0:
		return nil, fmt.Errorf("%s: unexpected arguments %q: it shows every projection (see -h)", cmd, pos)
	case named && len(pos) == 0:
		return nil, fmt.Errorf("%s: name the projection, e.g. orderd %s order_summaries (see -h)", cmd, cmd)
	case named && len(pos) > 1:
		return nil, fmt.Errorf("%s: unexpected arguments %q (see -h)", cmd, pos[1:])
	case named:
		op.projection = pos[0]
	}

	token := strings.TrimSpace(getenv("ADMIN_TOKEN"))
	devToken := filepath.Join(dataDir, "admin-token")
	// Neither a token nor a server named: the development mode's server
	// (both servers embedded, serve's own default) keeps its token in its
	// data dir, and this shell has not exported it.
	dev := getenv("MONGODB_URI") == "" && getenv("NATS_URL") == ""
	if token == "" && dev {
		if b, err := os.ReadFile(devToken); err == nil {
			token, op.tokenShell = strings.TrimSpace(string(b)), "$(cat "+devToken+")"
		}
	}
	if op.api, err = orderhttp.NewClient(orderhttp.ClientConfig{URL: serviceURL, Token: token,
		HTTPClient: &http.Client{Timeout: adminRequestTimeout}}); err != nil {
		return nil, fmt.Errorf("%s: -url %q: want http://host:port", cmd, serviceURL)
	}
	if op.interval <= 0 {
		return nil, fmt.Errorf("%s: -interval must be positive", cmd)
	}
	if token == "" {
		how := "set ADMIN_TOKEN to the token the service was started with (it is read from the environment only, never from a flag)"
		if dev {
			how += fmt.Sprintf("; a server in the development mode keeps its own in <data-dir>/admin-token, and there is none in %s: "+
				"name its data dir with -data-dir or ORDERD_DATA_DIR", devToken)
		}
		return nil, fmt.Errorf("%s: no admin token: %s", cmd, how)
	}
	return op, nil
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

// command is one admin subcommand at work: the API client with the
// admin token, and what its errors and hints name.
type command struct {
	cmd        string // subcommand, the prefix of errors
	projection string // named on the command line; "" for status
	tokenShell string // what gives the token in a shell: "$ADMIN_TOKEN", or the development mode's file
	api        *orderhttp.Client
	interval   time.Duration // how often wait polls a job
}

// adminError is an answer other than 2xx, as the operator reads it.
type adminError struct {
	cmd  string
	err  *orderhttp.Error
	hint string
}

func (e *adminError) Error() string {
	var b strings.Builder
	b.WriteString(e.cmd + ": ")
	p := e.err.Problem
	if p.Type == "" {
		fmt.Fprintf(&b, "unexpected answer: %s", cmp.Or(p.Detail, http.StatusText(p.Status)))
	} else {
		b.WriteString(cmp.Or(p.Title, http.StatusText(p.Status)))
		if p.Detail != "" {
			b.WriteString(": " + p.Detail)
		}
		if len(p.Errors) > 0 {
			fields := make([]string, len(p.Errors))
			for i, f := range p.Errors {
				fields[i] = f.Field + ": " + f.Detail
			}
			b.WriteString(" (" + strings.Join(fields, "; ") + ")")
		}
	}
	fmt.Fprintf(&b, " (HTTP %d)", p.Status)
	if e.hint != "" {
		b.WriteString("\n  hint: " + e.hint)
	}
	return b.String()
}

func (e *adminError) Unwrap() error { return e.err }

// fail turns an error of the API client into the subcommand's: an answer
// other than 2xx becomes an *adminError with a hint for the usual
// mistakes; no answer at all says where it was expected. When ctx has
// ended it returns ctx's error.
func (o *command) fail(ctx context.Context, err error) error {
	var pe *orderhttp.Error
	if errors.As(err, &pe) {
		e := &adminError{cmd: o.cmd, err: pe}
		switch {
		case pe.Status == http.StatusUnauthorized:
			e.hint = fmt.Sprintf("the token in %s is not the server's ADMIN_TOKEN; set ADMIN_TOKEN to the token orderd was started with", o.tokenShell)
		case pe.Status == http.StatusNotFound && (pe.Type == "/problems/route" || pe.Type == ""):
			e.hint = "the server has no admin routes: it was started without ADMIN_TOKEN, so they are off. " +
				"Restart it with ADMIN_TOKEN set (or check -url)"
		case errors.Is(pe, domain.ErrJobRunning):
			e.hint = fmt.Sprintf("wait for that rebuild to end, or stop it with: orderd rebuild %s -cancel <job-id>", cmp.Or(o.projection, "<projection>"))
		}
		return e
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: no answer from %s: %w\n  hint: is orderd running there? Set -url, ORDERD_URL or ORDERD_HTTP_ADDR", o.cmd, o.api.BaseURL(), ue.Err)
	}
	return fmt.Errorf("%s: %w", o.cmd, err)
}

// unknownProjection adds the names of the projections to a not-found
// answer to a start request (the only thing it can be about).
func (o *command) unknownProjection(ctx context.Context, err error) error {
	var ae *adminError
	if !errors.As(err, &ae) || !errors.Is(ae.err, domain.ErrNotFound) {
		return err
	}
	rep, lerr := o.api.Projections(ctx)
	if lerr != nil || len(rep.Projections) == 0 {
		return err
	}
	var names []string
	for _, p := range rep.Projections {
		names = append(names, p.Name)
	}
	if len(names) == 1 {
		ae.hint = "the only projection is " + names[0]
	} else {
		ae.hint = "the projections are " + strings.Join(names, ", ")
	}
	return ae
}

// wait polls job every o.interval until it is final, showing progress. When ctx ends it stops waiting (the job keeps
// running), says how to follow the job, and returns an error.
func (o *command) wait(ctx context.Context, job jobs.Job, p *progress) (jobs.Job, error) {
	p.show(job)
	t := time.NewTicker(o.interval)
	defer t.Stop()
	failures := 0
	for !job.State.Final() {
		select {
		case <-ctx.Done():
			return job, o.stoppedWaiting(p, job)
		case <-t.C:
		}
		next, err := o.api.Job(ctx, job.Kind, job.Projection, job.ID)
		if ctx.Err() != nil {
			return job, o.stoppedWaiting(p, job)
		}
		if err != nil {
			err = o.fail(ctx, err)
			var ae *adminError
			if errors.As(err, &ae) && ae.err.Status < 500 {
				p.end()
				return job, err
			}
			if failures++; failures >= adminPollFailures {
				p.end()
				return job, fmt.Errorf("%w\n  (gave up after %d failed polls; job %s may still be running)", err, failures, job.ID)
			}
			first, _, _ := strings.Cut(err.Error(), "\n")
			p.note(fmt.Sprintf("poll failed (%d of %d), retrying: %v", failures, adminPollFailures, first))
			continue
		}
		failures = 0
		job = next
		p.show(job)
	}
	p.end()
	return job, nil
}

func (o *command) stoppedWaiting(p *progress, job jobs.Job) error {
	p.end()
	w := p.w
	fmt.Fprintf(w, "Stopped waiting. The %s job %s keeps running on the server (was %s).\n", job.Kind, job.ID, job.State)
	fmt.Fprintf(w, "  check it:  curl -H \"Authorization: Bearer %s\" %s\n", o.tokenShell, o.api.JobURL(job.Kind, job.Projection, job.ID))
	if job.Kind == jobs.KindRebuild {
		fmt.Fprintf(w, "  stop it:   orderd rebuild %s -cancel %s\n", job.Projection, job.ID)
	}
	return fmt.Errorf("%s: stopped waiting for job %s, which keeps running", o.cmd, job.ID)
}

// newTable returns a writer that aligns the tab-separated cells of the
// subcommands' tables in columns two spaces apart.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func suffix(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}
