package operator

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/orderd/orderd/jobs"
)

// progressEvery is how often the progress line is printed when stderr is
// not a terminal.
const progressEvery = 5 * time.Second

// jobPhase reads a job's phase as the server worked it out (Jobs.Get, with
// jobs.Job.PhaseAt). A server older than the phase fields sends none:
// the same function then works it out here at now.
func jobPhase(j jobs.Job, now time.Time) jobs.JobPhase {
	if j.Phase == "" {
		return j.PhaseAt(now)
	}
	return j.JobPhase
}

// progress shows a job's phase and progress: on a terminal as a progress
// bar, a new one for each phase, otherwise as a line printed when the
// state or phase changes and every progressEvery.
type progress struct {
	w         io.Writer
	kind      string
	tty       bool
	bar       *progressbar.ProgressBar // the phase's bar on a terminal; nil when none is drawn
	barPhase  string
	barStep   int
	last      time.Time
	lastState jobs.JobState
	lastPhase string
	now       func() time.Time
}

func newProgress(w io.Writer, kind string) *progress {
	// The progress line redraws itself only on a terminal (not /dev/null,
	// a pipe or a file).
	f, ok := w.(*os.File)
	return &progress{w: w, kind: kind, tty: ok && term.IsTerminal(int(f.Fd())), now: time.Now}
}

// describe is what is known of the job in its phase ph, without the
// percentage, which the bar shows.
func (p *progress) describe(j jobs.Job, ph jobs.JobPhase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", p.kind, j.State)
	if ph.Steps > 0 {
		fmt.Fprintf(&b, ", %d/%d %s", ph.Step, ph.Steps, ph.Phase)
	}
	b.WriteString(":")
	switch {
	case ph.Phase == "verifying" && ph.EventsTotal > 0 && j.Kind == jobs.KindRebuild:
		fmt.Fprintf(&b, " %d of %d events verified", ph.EventsDone, ph.EventsTotal)
	case ph.Phase == "switching":
		fmt.Fprintf(&b, " verified; reads move to %s", j.Shadow)
	default:
		fmt.Fprintf(&b, " %d streams, %d events", j.Streams, j.Events)
		if j.RatePerSecond > 0 {
			fmt.Fprintf(&b, ", %.0f events/s", j.RatePerSecond)
		}
	}
	if ph.PhaseETASeconds > 0 {
		fmt.Fprintf(&b, ", %s ETA %s", ph.Phase, time.Duration(ph.PhaseETASeconds*float64(time.Second)))
	}
	if j.PoisonStreams > 0 {
		fmt.Fprintf(&b, ", %d poison streams", j.PoisonStreams)
	}
	if j.CancelRequested && !j.State.Final() {
		b.WriteString(", cancel requested")
	}
	return b.String()
}

func (p *progress) show(j jobs.Job) {
	ph := jobPhase(j, p.now())
	if !p.tty {
		now := p.now()
		if j.State != p.lastState || ph.Phase != p.lastPhase || now.Sub(p.last) >= progressEvery {
			line := p.describe(j, ph)
			if ph.Percent != nil && !j.State.Final() {
				line += fmt.Sprintf(" [%d %%]", *ph.Percent)
			}
			fmt.Fprintln(p.w, line)
			p.last, p.lastState, p.lastPhase = now, j.State, ph.Phase
		}
		return
	}
	final := j.State.Final()
	if p.bar != nil && ph.Phase != p.barPhase && !final {
		// The previous step is over: its bar ends full. Waiting in the
		// queue was no step: its bar stays as it was.
		if p.barStep > 0 {
			_ = p.bar.Finish()
		} else {
			_ = p.bar.Exit()
		}
		p.end()
	}
	if p.bar == nil {
		if final {
			fmt.Fprintln(p.w, p.describe(j, ph))
			return
		}
		p.bar = progressbar.NewOptions(100, progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetWidth(30), progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetRenderBlankState(true), progressbar.OptionSetDescription(p.describe(j, ph)))
		p.barPhase, p.barStep = ph.Phase, ph.Step
	}
	p.bar.Describe(p.describe(j, ph))
	switch {
	case j.State == jobs.StateSucceeded:
		_ = p.bar.Finish()
	case ph.Percent != nil:
		_ = p.bar.Set(*ph.Percent)
	default:
		_ = p.bar.Add(0)
	}
	if final {
		p.end()
	}
}

// note prints a message on a line of its own.
func (p *progress) note(msg string) {
	p.end()
	fmt.Fprintln(p.w, msg)
}

// end finishes the bar being drawn: the next show starts a new one.
func (p *progress) end() {
	if p.bar != nil {
		fmt.Fprintln(p.w)
		p.bar = nil
	}
}
