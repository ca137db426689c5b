package operator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/jobs"
)

const rebuildUsage = `Usage: orderd rebuild <projection> [flags]

Rebuilds a read model (projection) from the event log, without downtime:
the service folds every order stream into a new "shadow" collection, which
the live projectors also keep up to date meanwhile, checks the shadow
against what that fold wrote, and each document that differs against the
log (verify before switch), and then switches reads to it. The
old collection is kept, and kept up to date, for a grace period
(ORDERD_REBUILD_GRACE), in which "orderd switch-back" reads it again; then
it is dropped. Only one rebuild of a projection runs at a time. A deploy
that bumps a projection's definition version starts one on its own.

` + adminUsage + `
Examples:
  export ADMIN_TOKEN=...                                # the server's token
  orderd rebuild order_summaries                        start, print the job id, return
  orderd rebuild order_summaries -wait -partitions 4    start and follow until it ends
  orderd rebuild order_summaries -cancel <job-id>       ask a running rebuild to stop

With -wait the rebuild's phase (1/3 scanning the log into the shadow, 2/3
verifying the shadow against what the scan recorded, 3/3 switching reads to
it), its
progress and the phase's ETA go to stderr, and a summary to stdout; the exit
status is 0 only when the rebuild succeeded. Ctrl-C stops waiting but not
the rebuild, which keeps running on the server. -cancel stops it: the
active collection then stays as it was.

Flags:
`

// Rebuild runs "orderd rebuild": args are the arguments after the
// subcommand, getenv reads the environment. The job id and summary go to
// stdout; usage, progress and hints to stderr. It returns nil for -h and
// for a rebuild that was started (or, with -wait, that succeeded).
func Rebuild(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.FlagSet("rebuild", rebuildUsage, stderr)
	partitions := fs.Int("partitions", 0, "split the scan of the log into `N` partitions (1 to 64), scanned at the same time by the instances with the jobs role, each running up to ORDERD_JOB_CONCURRENCY tasks (default 4) at once; partitions beyond that wait for a free slot; 0 leaves it to the service (1)")
	wait := fs.Bool("wait", false, "follow the job until it ends, print a summary, and exit non-zero unless it succeeded")
	cancelID := fs.String("cancel", "", "do not start a rebuild: ask the running rebuild `job-id` to stop (with -wait, follow it until it has stopped)")
	op, err := parse(fs, args, getenv, true, true)
	if op == nil {
		return err // nil for -h
	}
	name := op.projection
	if *partitions < 0 || *partitions > jobs.MaxPartitions {
		return fmt.Errorf("rebuild: -partitions %d: must be 1 to %d (or 0 for the service's default)", *partitions, jobs.MaxPartitions)
	}

	var job jobs.Job
	if *cancelID != "" {
		if *partitions != 0 {
			return errors.New("rebuild: -partitions does not go with -cancel")
		}
		if job, err = op.api.CancelRebuild(ctx, name, *cancelID); err != nil {
			return op.fail(ctx, err)
		}
		fmt.Fprintf(stdout, "cancel requested for rebuild %s of %s (now %s)\n", job.ID, name, job.State)
		fmt.Fprintln(stdout, "It stops at its next checkpoint; the active collection stays as it was.")
	} else {
		if job, err = op.api.StartRebuild(ctx, name, *partitions); err != nil {
			return op.unknownProjection(ctx, op.fail(ctx, err))
		}
		fmt.Fprintf(stdout, "rebuild of %s started: job %s (partitions %d, shadow collection %s)\n",
			name, job.ID, job.Partitions, job.Shadow)
		fmt.Fprintf(stdout, "job: %s\n", op.api.JobURL(jobs.KindRebuild, name, job.ID))
		if !*wait {
			fmt.Fprintf(stdout, "follow it with a GET of that URL (Authorization: Bearer %s); stop it with: orderd rebuild %s -cancel %s\n",
				op.tokenShell, name, job.ID)
			return nil
		}
	}
	if !*wait {
		return nil
	}
	job, err = op.wait(ctx, job, newProgress(stderr, "rebuild"))
	if err != nil {
		return err
	}
	// The summary names the active collection as the service reports it
	// now; "" when it cannot be read.
	active := ""
	if rep, err := op.api.Projections(ctx); err == nil {
		for _, p := range rep.Projections {
			if p.Name == name {
				active = p.ActiveCollection
			}
		}
	}
	if active == "" && job.State == jobs.StateSucceeded {
		active = job.Shadow // the switch made it active
	}
	if err := printRebuild(stdout, job, active); err != nil {
		return err
	}
	switch {
	case *cancelID != "" && job.State == jobs.StateCanceled:
		return nil
	case job.State != jobs.StateSucceeded:
		return fmt.Errorf("rebuild: job %s ended %s%s", job.ID, job.State, suffix(": ", job.Error))
	}
	return nil
}

// printRebuild writes the summary of a finished rebuild.
func printRebuild(w io.Writer, job jobs.Job, active string) error {
	duration := "-"
	if !job.FinishedAt.IsZero() {
		duration = job.FinishedAt.Sub(job.CreatedAt).Round(time.Millisecond).String()
		// The finish task starts when the scan is over: from then on the
		// rebuild verifies the shadow and switches to it.
		fin, _ := job.Task("finish")
		var phases []string
		if job.State == jobs.StateSucceeded && !job.StartedAt.IsZero() && !fin.StartedAt.IsZero() {
			phases = append(phases, "scanning "+fin.StartedAt.Sub(job.StartedAt).Round(time.Millisecond).String(),
				"verifying and switching "+job.FinishedAt.Sub(fin.StartedAt).Round(time.Millisecond).String())
		} else if !job.StartedAt.IsZero() {
			phases = append(phases, "running "+job.FinishedAt.Sub(job.StartedAt).Round(time.Millisecond).String())
		}
		if len(phases) > 0 {
			duration += " (" + strings.Join(phases, ", ") + ")"
		}
	}
	fmt.Fprintf(w, "rebuild %s of %s: %s\n", job.ID, job.Projection, job.State)
	tw := newTable(w)
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
