package operator

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/cmd/orderd/internal/cli"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/outbox"
)

// statusErrorWidth is how many characters of a projection's last error
// the table shows.
const statusErrorWidth = 60

const statusUsage = `Usage: orderd status [flags]

Shows the read models (projections) of a running service at a glance, one
row each (the service runs one, order_summaries), for example:

  PROJECTION       VERSION           ACTIVE COLLECTION     LAG  BUILD LAG  DEAD LETTERS  LAST VERIFY   LAST REBUILD  LAST ERROR
  order_summaries  v2 (previous v1)  order_summaries_v2_…  0    -          0             clean 2m ago  succeeded     -

The columns:
  PROJECTION         the read model
  VERSION            the version of its definition readers read; then one
                     being built (a deploy bumped it, or a rebuild runs) and
                     the one kept for "orderd switch-back"; "none" before
                     the first build of a projection new to the log
  ACTIVE COLLECTION  the collection reads are served from (in mongosh, open it
                     by this name); a rebuild switches it to a new one
  LAG                events the collection readers read has not applied yet
                     (pending or in flight on the consumers of its version);
                     it should fall back to 0 when the load drops. "-" when
                     the service cannot tell.
  BUILD LAG          while a rebuild runs, the same for the consumers feeding
                     the collection it builds, and the version built: after
                     a deploy these are the new version's, and their lag is
                     not what readers see. "-" when no rebuild runs
  DEAD LETTERS       events the projection gave up on and parked; each one
                     means a read-model document is behind the log
  LAST VERIFY        the latest "orderd verify": "clean 2m ago" (nothing
                     differed from the log), "drift 3 2m ago" (3 documents
                     differ and were not repaired), "repaired 3 2m ago", the
                     state of one not finished yet or failed, or "-" (never)
  LAST REBUILD       the latest rebuild ("orderd rebuild", or the build of a
                     version a deploy bumped): its state (queued, running,
                     succeeded, failed, canceled), and while it runs its
                     phase, progress and the phase's ETA as its job route
                     shows them (1/3 scanning, 2/3 verifying, 3/3
                     switching); "-" (never)
  LAST ERROR         the projection's last failure seen by the service (a
                     write that failed, an event parked, a failed rebuild),
                     cut to 60 characters; "-" when none

Then comes one row per partition of each projection, for example:

  PROJECTION       PARTITION  OWNER        PINNED FOR  LAG  BEHIND  APPLIED  RATE/S
  order_summaries  0          projector-1  8m0s        0    0.0s    1520     12.4
  order_summaries  1          -            -           37   41.3s   0        0.0

  PARTITION   the partition: a share of the order streams, consumed by one
              projector process at a time
  OWNER       the instance id JetStream pins the partition's deliveries to;
              "-" when none (its owner died and the pin has not timed out,
              or no projector runs): its LAG then grows
  PINNED FOR  how long the owner has held the pin
  LAG         events of the partition not applied yet; "-" when unknown
  BEHIND      0 when LAG is 0, else the time since the newest event the
              partition applied was recorded: how stale its read-model
              documents can be; "-" when unknown
  APPLIED     events the owner applied since it took the partition
  RATE/S      events per second the owner applied lately

Below the tables come what to do next: how to list dead letters, stop a
running rebuild, or repair drift. The exit status is 0 whenever the
service answered, whatever the state of the projections.

The command reads GET /v1/admin/projections of the admin API (the full
JSON, with the whole last error, is there too). Both sides need the same
token: start the service with ADMIN_TOKEN set (without it the admin routes
are off), and set ADMIN_TOKEN in this shell too. The token is read from
the environment only, never from a flag (flags show in ps).

Examples:
  export ADMIN_TOKEN=...                        # the server's token
  orderd status                                 the service on 127.0.0.1:8080
  orderd status -url http://orderd.internal:8080

Flags:
`

// Status runs "orderd status", like Rebuild: the table goes to
// stdout, usage to stderr. It returns nil for -h and whenever the service
// answered.
func Status(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.FlagSet("status", statusUsage, stderr)
	op, err := parse(fs, args, getenv, false, false)
	if op == nil {
		return err // nil for -h
	}
	rep, err := op.api.Projections(ctx)
	if err != nil {
		return op.fail(ctx, err)
	}
	if err := printStatus(stdout, op, rep.Projections, time.Now()); err != nil {
		return err
	}
	return printRelay(stdout, rep.Relay, time.Now())
}

// printRelay writes the relay's line: who holds its lease, and how far
// its checkpoint has come.
func printRelay(w io.Writer, r outbox.RelayStatus, now time.Time) error {
	if r.Owner == "" {
		_, err := fmt.Fprintln(w, "\nRELAY  no relay has run on this log yet: start an instance with the relay role")
		return err
	}
	held := fmt.Sprintf("held by %s (epoch %d, lease for %s more)", r.Owner, r.Epoch, r.LeaseUntil.Sub(now).Round(time.Second))
	if !r.LeaseUntil.After(now) {
		held = fmt.Sprintf("held by nobody (last %s, epoch %d): is an instance with the relay role running?", r.Owner, r.Epoch)
	}
	cp := "no checkpoint yet"
	if !r.CheckpointSavedAt.IsZero() {
		cp = fmt.Sprintf("checkpoint at commits recorded %s (%s), saved %s", r.CheckpointRecordedAt.UTC().Format(time.RFC3339),
			ago(now.Sub(r.CheckpointRecordedAt)), ago(now.Sub(r.CheckpointSavedAt)))
	}
	_, err := fmt.Fprintf(w, "\nRELAY  %s; %s\n", held, cp)
	return err
}

// versionCell is a projection's versions: the active one, then one being
// built and the one kept for a switch back, e.g. "v2 (building v3,
// previous v1)"; "none" before a first build.
func versionCell(p admin.ProjectionStatus) string {
	cell := "none"
	if p.ActiveVersion > 0 {
		cell = fmt.Sprintf("v%d", p.ActiveVersion)
	}
	var more []string
	if p.ShadowVersion > 0 {
		more = append(more, fmt.Sprintf("building v%d", p.ShadowVersion))
	}
	if p.PreviousVersion > 0 {
		more = append(more, fmt.Sprintf("previous v%d", p.PreviousVersion))
	}
	if len(more) > 0 {
		cell += " (" + strings.Join(more, ", ") + ")"
	}
	return cell
}

// printStatus writes the table of the projections, then hints for what
// needs attention; now is the time the ages are counted to.
func printStatus(w io.Writer, op *command, list []admin.ProjectionStatus, now time.Time) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "the service reports no projections")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "PROJECTION\tVERSION\tACTIVE COLLECTION\tLAG\tBUILD LAG\tDEAD LETTERS\tLAST VERIFY\tLAST REBUILD\tLAST ERROR")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.Name, versionCell(p), cmp.Or(p.ActiveCollection, "-"), readLag(p), buildLag(p),
			p.DeadLetters, verifyCell(p.LastVerify, now), rebuildCell(p.LastRebuild), cmp.Or(truncate(p.LastError, statusErrorWidth), "-"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printPartitions(w, list, now); err != nil {
		return err
	}
	var notes []string
	for _, p := range list {
		if p.DeadLetters > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d dead letters; list them with\n    curl -H \"Authorization: Bearer %s\" '%s'",
				p.Name, p.DeadLetters, op.tokenShell, op.api.DeadLettersURL(p.Name)))
		}
		if r := p.LastRebuild; r != nil && !r.State.Final() {
			notes = append(notes, fmt.Sprintf("%s: rebuild %s is %s, filling %s; follow it with\n    curl -H \"Authorization: Bearer %s\" %s\n  or stop it with: orderd rebuild %s -cancel %s",
				p.Name, r.Job, r.State, cmp.Or(p.ShadowCollection, "a new collection"), op.tokenShell,
				op.api.JobURL(jobs.KindRebuild, p.Name, r.Job), p.Name, r.Job))
		}
		if p.PreviousCollection != "" {
			notes = append(notes, fmt.Sprintf("%s: %s (version %d) is kept for the rebuild grace after the last switch; read it again with: orderd switch-back %s",
				p.Name, p.PreviousCollection, p.PreviousVersion, p.Name))
		}
		if p.Version > p.ActiveVersion && p.ShadowVersion != p.Version && p.SwitchedBackFrom >= p.Version {
			notes = append(notes, fmt.Sprintf("%s: version %d was switched back from and is not built again on its own; build it with: orderd rebuild %s",
				p.Name, p.Version, p.Name))
		}
		if v := p.LastVerify; v != nil && v.State == jobs.StateSucceeded && v.Drift > v.Repaired {
			notes = append(notes, fmt.Sprintf("%s: %d documents differed from the log at the last verify; repair them with: orderd verify %s -repair",
				p.Name, v.Drift-v.Repaired, p.Name))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, n)
		}
	}
	return nil
}

// printPartitions writes the table of the projections' partitions, if the
// service reported any.
func printPartitions(w io.Writer, list []admin.ProjectionStatus, now time.Time) error {
	if !slices.ContainsFunc(list, func(p admin.ProjectionStatus) bool { return len(p.Partitions) > 0 }) {
		return nil
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "PROJECTION\tPARTITION\tOWNER\tPINNED FOR\tLAG\tBEHIND\tAPPLIED\tRATE/S")
	for _, p := range list {
		for _, pt := range p.Partitions {
			lag, pinned, secs := "-", "-", "-"
			if pt.Lag != nil {
				lag = fmt.Sprint(*pt.Lag)
			}
			if pt.LagSeconds != nil {
				secs = fmt.Sprintf("%.1fs", *pt.LagSeconds)
			}
			if !pt.PinnedAt.IsZero() {
				pinned = now.Sub(pt.PinnedAt).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%.1f\n", p.Name, pt.Partition, cmp.Or(pt.Owner, "-"), pinned, lag, secs, pt.Applied, pt.ApplyRate)
		}
	}
	return tw.Flush()
}

// readLag is the LAG cell: the lag of the consumers feeding the
// collection readers read (active_lag); "-" when unknown.
func readLag(p admin.ProjectionStatus) string {
	if p.ActiveLag == nil {
		return "-"
	}
	return fmt.Sprint(*p.ActiveLag)
}

// buildLag is the BUILD LAG cell: while a rebuild runs, the lag of the
// consumers feeding its shadow, with the version built ("12 (v3)"); "-"
// when none runs or it is unknown.
func buildLag(p admin.ProjectionStatus) string {
	if p.ShadowVersion == 0 || p.ShadowLag == nil {
		return "-"
	}
	return fmt.Sprintf("%d (v%d)", *p.ShadowLag, p.ShadowVersion)
}

// rebuildCell is the LAST REBUILD cell: the state of the latest rebuild,
// and while it runs its phase, progress and the phase's ETA as its job
// route has them, e.g. "running 1/3 scanning 49% ETA 12s"; "-" (never).
func rebuildCell(r *jobs.JobSummary) string {
	if r == nil {
		return "-"
	}
	s := string(r.State)
	if r.State.Final() || r.Phase == "" || r.Phase == string(r.State) {
		return s
	}
	if r.Steps > 0 {
		s += fmt.Sprintf(" %d/%d", r.Step, r.Steps)
	}
	s += " " + r.Phase
	if r.Percent != nil {
		s += fmt.Sprintf(" %d%%", *r.Percent)
	}
	if r.PhaseETASeconds > 0 {
		s += " ETA " + (time.Duration(r.PhaseETASeconds) * time.Second).String()
	}
	return s
}

// verifyCell is the LAST VERIFY cell: "-" (never), the state of a verify
// that has not succeeded, or its outcome and age.
func verifyCell(v *jobs.VerifySummary, now time.Time) string {
	if v == nil {
		return "-"
	}
	if v.State != jobs.StateSucceeded {
		return string(v.State)
	}
	s := "clean"
	switch left := v.Drift - v.Repaired; {
	case left > 0:
		s = fmt.Sprintf("drift %d", left)
	case v.Drift > 0:
		s = fmt.Sprintf("repaired %d", v.Repaired)
	}
	if !v.FinishedAt.IsZero() {
		s += " " + ago(now.Sub(v.FinishedAt))
	}
	return s
}

// ago says how long ago something happened, in its largest whole unit:
// "just now", "42s ago", "2m ago", "5h ago", "3d ago".
func ago(d time.Duration) string {
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
}

// truncate returns s on one line, cut to at most n characters (the last
// three "..." when cut).
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}
