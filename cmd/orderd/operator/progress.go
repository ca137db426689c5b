package operator

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/orderd/orderd/domain"
)

// progressEvery is how often the progress line is printed when stderr is
// not a terminal.
const progressEvery = 5 * time.Second

// phase is where a job is, read from the job and task status the admin
// API returns: the step it is in, how far that step is and when it
// should end.
type phase struct {
	Name        string // queued, planning, scanning, verifying, switching, replaying, or the final state
	Step, Steps int    // 1-based step of Steps; 0 when the job has none (queued, final)
	Percent     int    // of this step, 0 to 100; -1 when unknown
	ETA         time.Duration
	Done, Total int64 // events of this step done and to do, when known (Total 0 otherwise)
}

// jobPhase reads a job's phase at now. A rebuild scans the log into its
// shadow (its partitions, with the server's ETA), then its finish task
// verifies the shadow against the sums the scan recorded (which count the
// events their documents reflect), or against the log when a partition
// recorded none (which folds the same events the scan did): either way
// the scan's count is the verify's total and the finish's own rate gives
// its ETA. It then switches reads to the shadow once it has recorded the
// collection it replaces. A verify or replay is one step.
func jobPhase(j domain.Job, now time.Time) phase {
	if j.State.Final() {
		pct := -1
		if j.State == domain.StateSucceeded {
			pct = 100
		}
		return phase{Name: string(j.State), Percent: pct}
	}
	scan := phase{Name: "scanning", Step: 1, Steps: 1, Percent: -1, Done: j.Events}
	if j.ETASeconds > 0 && j.RatePerSecond > 0 {
		left := j.ETASeconds * j.RatePerSecond
		scan.Percent = min(99, int(100*float64(j.Events)/(float64(j.Events)+left)))
		scan.ETA = time.Duration(j.ETASeconds * float64(time.Second)).Round(time.Second)
		scan.Total = j.Events + int64(left)
	}
	switch j.Kind {
	case domain.KindVerify:
		scan.Name = "verifying"
	case domain.KindReplay:
		scan.Name = "replaying"
	case domain.KindRebuild:
		scan.Steps = 3
		return rebuildPhase(j, scan, now)
	}
	if j.State == domain.StateQueued && j.StartedAt.IsZero() {
		return phase{Name: "queued", Percent: -1}
	}
	return scan
}

func rebuildPhase(j domain.Job, scan phase, now time.Time) phase {
	plan, planned := j.Task("plan")
	if !planned || plan.State != "done" {
		if j.StartedAt.IsZero() {
			return phase{Name: "queued", Percent: -1}
		}
		return phase{Name: "planning", Step: 1, Steps: 3, Percent: 0}
	}
	for _, t := range j.Tasks {
		if strings.HasPrefix(t.Name, "part-") && t.State != "done" {
			return scan
		}
	}
	if j.Replaced != "" {
		return phase{Name: "switching", Step: 3, Steps: 3, Percent: -1}
	}
	v := phase{Name: "verifying", Step: 2, Steps: 3, Percent: 0, Total: j.Events}
	fin, ok := j.Task("finish")
	if !ok || fin.StartedAt.IsZero() {
		return v
	}
	v.Done = fin.Events
	if j.Events > 0 {
		v.Percent = min(99, int(100*fin.Events/j.Events))
	}
	if secs := now.Sub(fin.StartedAt).Seconds(); secs > 0 && fin.Events > 0 && j.Events > fin.Events {
		rate := float64(fin.Events) / secs
		v.ETA = time.Duration(float64(j.Events-fin.Events) / rate * float64(time.Second)).Round(time.Second)
	}
	return v
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
	lastState domain.JobState
	lastPhase string
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

// describe is what is known of the job in its phase ph, without the
// percentage, which the bar shows.
func (p *progress) describe(j domain.Job, ph phase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", p.kind, j.State)
	if ph.Steps > 0 {
		fmt.Fprintf(&b, ", %d/%d %s", ph.Step, ph.Steps, ph.Name)
	}
	b.WriteString(":")
	switch {
	case ph.Name == "verifying" && ph.Total > 0 && j.Kind == domain.KindRebuild:
		fmt.Fprintf(&b, " %d of %d events verified", ph.Done, ph.Total)
	case ph.Name == "switching":
		fmt.Fprintf(&b, " verified; reads move to %s", j.Shadow)
	default:
		fmt.Fprintf(&b, " %d streams, %d events", j.Streams, j.Events)
		if j.RatePerSecond > 0 {
			fmt.Fprintf(&b, ", %.0f events/s", j.RatePerSecond)
		}
	}
	if ph.ETA > 0 {
		fmt.Fprintf(&b, ", %s ETA %s", ph.Name, ph.ETA)
	}
	if j.PoisonStreams > 0 {
		fmt.Fprintf(&b, ", %d poison streams", j.PoisonStreams)
	}
	if j.CancelRequested && !j.State.Final() {
		b.WriteString(", cancel requested")
	}
	return b.String()
}

// line is the progress line printed when stderr is not a terminal.
func (p *progress) line(j domain.Job, ph phase) string {
	s := p.describe(j, ph)
	if ph.Percent >= 0 && !j.State.Final() {
		s += fmt.Sprintf(" [%d %%]", ph.Percent)
	}
	return s
}

func (p *progress) show(j domain.Job) {
	ph := jobPhase(j, p.now())
	if !p.tty {
		now := p.now()
		if j.State != p.lastState || ph.Name != p.lastPhase || now.Sub(p.last) >= progressEvery {
			fmt.Fprintln(p.w, p.line(j, ph))
			p.last, p.lastState, p.lastPhase = now, j.State, ph.Name
		}
		return
	}
	final := j.State.Final()
	if p.bar != nil && ph.Name != p.barPhase && !final {
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
		p.barPhase, p.barStep = ph.Name, ph.Step
	}
	p.bar.Describe(p.describe(j, ph))
	switch {
	case j.State == domain.StateSucceeded:
		_ = p.bar.Finish()
	case ph.Percent >= 0:
		_ = p.bar.Set(ph.Percent)
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
