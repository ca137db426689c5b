package operator

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/projection"
)

const verifyUsage = `Usage: orderd verify <projection> [flags]

Checks a read model (projection) against the event log: the service folds
every order stream again and compares the result with the documents of the
active collection. It counts documents that are missing, stale (at an older
version), extra (no such stream) or different, and prints them as a table
with a few examples and two digests (of the read model and of the log's
fold: equal exactly when nothing drifted). With -repair the documents that
differ are rewritten from the log (extra ones deleted).

` + adminUsage + `
Examples:
  export ADMIN_TOKEN=...                     # the server's token
  orderd verify order_summaries              report drift, change nothing
  orderd verify order_summaries -repair      report drift and repair it

With -wait (the default) the command follows the job: its phase, progress
and ETA go to stderr, as for a rebuild, and the report to stdout. The exit
status is 0 when nothing drifted or everything that drifted was repaired,
and non-zero otherwise (or when the job failed), so scripts can use it.
Ctrl-C stops waiting but not the job. With -wait=false it prints the job id
and returns.

Flags:
`

// Verify runs "orderd verify", like Rebuild. The report goes to
// stdout, the job's progress to stderr. It returns nil for -h, for a
// verify started with -wait=false, and when the job succeeded with no
// drift left unrepaired.
func Verify(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.FlagSet("verify", verifyUsage, stderr)
	repair := fs.Bool("repair", false, "rewrite the documents that differ from the log (and delete extra ones)")
	wait := fs.Bool("wait", true, "follow the job until it ends, print the report, and exit non-zero on drift left unrepaired; -wait=false only starts it")
	op, err := parse(fs, args, getenv, true, true)
	if op == nil {
		return err // nil for -h
	}
	name := op.projection
	job, err := op.api.StartVerify(ctx, name, *repair)
	if err != nil {
		return op.unknownProjection(ctx, op.fail(ctx, err))
	}
	if !*wait {
		fmt.Fprintf(stdout, "verify of %s started: job %s\n", name, job.ID)
		fmt.Fprintf(stdout, "job: %s\n", op.api.JobURL(jobs.KindVerify, name, job.ID))
		return nil
	}
	fmt.Fprintf(stderr, "verify of %s started: job %s\n", name, job.ID)
	job, err = op.wait(ctx, job, newProgress(stderr, "verify"))
	if err != nil {
		return err
	}
	mode := "report only"
	if job.Repair {
		mode = "repair"
	}
	fmt.Fprintf(stdout, "verify of %s (%s): job %s %s\n", name, mode, job.ID, job.State)
	if job.State != jobs.StateSucceeded || job.Report == nil {
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
func printVerifyReport(w io.Writer, rep *projection.VerifyReport) error {
	tw := newTable(w)
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
	tw = newTable(w)
	fmt.Fprintln(tw, "  KIND\tID\tSTORED VERSION\tLOG VERSION\tFIELDS")
	for _, e := range rep.Examples {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", e.Kind, e.ID, e.StoredVersion, e.LogVersion, cmp.Or(strings.Join(e.Fields, ","), "-"))
	}
	return tw.Flush()
}
