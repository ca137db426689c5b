package operator

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/orderd/orderd/domain"
)

// progressEvery is how often the progress line is printed when stderr is
// not a terminal.
const progressEvery = 5 * time.Second

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
