package operator

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/orderd/orderd/jobs"
)

// rebuildRun is one rebuild as GET of its job shows it from queued to
// succeeded: a 1,000-event scan over two partitions, then a finish task
// that verifies the shadow for 40 s before it switches.
func rebuildRun(t0 time.Time) []struct {
	at  time.Time
	job jobs.Job
} {
	job := func(state jobs.JobState, events int64, eta float64, tasks ...jobs.Task) jobs.Job {
		j := jobs.Job{ID: "j1", Kind: jobs.KindRebuild, Projection: "order_summaries", State: state,
			Shadow: "order_summaries_2", Events: events, Streams: events / 10, Tasks: tasks, ETASeconds: eta}
		if state != jobs.StateQueued {
			j.StartedAt = t0
			j.RatePerSecond = 50
		}
		return j
	}
	task := func(name, state string, events int64, started time.Time) jobs.Task {
		return jobs.Task{Name: name, State: state, Events: events, StartedAt: started}
	}
	done := func(name string) jobs.Task { return task(name, "done", 500, t0) }
	var zero time.Time
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	switching := job(jobs.StateRunning, 1000, 0, task("plan", "done", 0, t0), done("part-0"), done("part-1"), task("finish", "running", 1000, at(20)))
	switching.Replaced = "order_summaries"
	succeeded := switching
	succeeded.State, succeeded.Tasks[3].State = jobs.StateSucceeded, "done"
	return []struct {
		at  time.Time
		job jobs.Job
	}{
		{t0, job(jobs.StateQueued, 0, 0, task("plan", "pending", 0, zero))},
		{at(1), job(jobs.StateRunning, 0, 0, task("plan", "running", 0, t0))},
		{at(5), job(jobs.StateRunning, 250, 15, task("plan", "done", 0, t0), task("part-0", "running", 125, t0), task("part-1", "running", 125, t0), task("finish", "pending", 0, zero))},
		{at(20), job(jobs.StateRunning, 1000, 0, task("plan", "done", 0, t0), done("part-0"), done("part-1"), task("finish", "pending", 0, zero))},
		{at(40), job(jobs.StateRunning, 1000, 0, task("plan", "done", 0, t0), done("part-0"), done("part-1"), task("finish", "running", 500, at(20)))},
		{at(61), switching},
		{at(62), succeeded},
	}
}

// verifyRun is one verify as GET of its job shows it from queued to
// succeeded: reading the read model (no events yet), then folding the
// 1,200 events of the log at 60 events/s, with the server's ETA.
func verifyRun(t0 time.Time) []struct {
	at  time.Time
	job jobs.Job
} {
	job := func(state jobs.JobState, events int64, eta float64) jobs.Job {
		j := jobs.Job{ID: "j2", Kind: jobs.KindVerify, Projection: "order_summaries", State: state,
			Events: events, Streams: events / 10, ETASeconds: eta,
			Tasks: []jobs.Task{{Name: "verify", State: "running", Events: events, StartedAt: t0}}}
		if state != jobs.StateQueued {
			j.StartedAt = t0
			j.RatePerSecond = 60
		} else {
			j.Tasks[0].State, j.Tasks[0].StartedAt = "pending", time.Time{}
		}
		return j
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	succeeded := job(jobs.StateSucceeded, 1200, 0)
	succeeded.Tasks[0].State = "done"
	return []struct {
		at  time.Time
		job jobs.Job
	}{
		{t0, job(jobs.StateQueued, 0, 0)},
		{at(1), job(jobs.StateRunning, 0, 0)},
		{at(6), job(jobs.StateRunning, 300, 15)},
		{at(11), job(jobs.StateRunning, 600, 10)},
		{at(21), succeeded},
	}
}

// TestJobPhase: a rebuild is shown scanning, then verifying with its own
// progress and ETA, then switching; not "scanning" at 100 % throughout.
func TestJobPhase(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 5, 0, 0, 0, time.UTC)
	pct := func(n int) *int { return &n }
	want := []jobs.JobPhase{
		{Phase: "queued"},
		{Phase: "planning", Step: 1, Steps: 3, Percent: pct(0)},
		{Phase: "scanning", Step: 1, Steps: 3, Percent: pct(25), PhaseETASeconds: 15, EventsDone: 250, EventsTotal: 1000},
		{Phase: "verifying", Step: 2, Steps: 3, Percent: pct(0), EventsTotal: 1000},
		{Phase: "verifying", Step: 2, Steps: 3, Percent: pct(50), PhaseETASeconds: 20, EventsDone: 500, EventsTotal: 1000},
		{Phase: "switching", Step: 3, Steps: 3},
		{Phase: "succeeded", Percent: pct(100)},
	}
	for i, s := range rebuildRun(t0) {
		if got := jobPhase(s.job, s.at); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d: phase %s, want %s", i, show(got), show(want[i]))
		}
	}
	wantVerify := []jobs.JobPhase{
		{Phase: "queued"},
		{Phase: "verifying", Step: 1, Steps: 1},
		{Phase: "verifying", Step: 1, Steps: 1, Percent: pct(25), PhaseETASeconds: 15, EventsDone: 300, EventsTotal: 1200},
		{Phase: "verifying", Step: 1, Steps: 1, Percent: pct(50), PhaseETASeconds: 10, EventsDone: 600, EventsTotal: 1200},
		{Phase: "succeeded", Percent: pct(100)},
	}
	for i, s := range verifyRun(t0) {
		if got := jobPhase(s.job, s.at); !reflect.DeepEqual(got, wantVerify[i]) {
			t.Errorf("verify step %d: phase %s, want %s", i, show(got), show(wantVerify[i]))
		}
	}
	// The server's phase is shown as given: the CLI works one out (with
	// the same function) only for a server that sends none.
	given := jobs.Job{Kind: jobs.KindRebuild, State: jobs.StateRunning, StartedAt: t0,
		JobPhase: jobs.JobPhase{Phase: "verifying", Step: 2, Steps: 3, Percent: pct(42), PhaseETASeconds: 9, EventsDone: 42, EventsTotal: 100}}
	if got := jobPhase(given, t0); !reflect.DeepEqual(got, given.JobPhase) {
		t.Errorf("server's phase: %s, want %s", show(got), show(given.JobPhase))
	}
	v := jobs.Job{Kind: jobs.KindVerify, State: jobs.StateRunning, StartedAt: t0, Events: 300, RatePerSecond: 100, ETASeconds: 7}
	if got := jobPhase(v, t0); got.Phase != "verifying" || got.Steps != 1 || percentOr(got) != 30 || got.PhaseETASeconds != 7 {
		t.Errorf("verify job: phase %s, want verifying 30 %% with ETA 7s", show(got))
	}
}

// percentOr returns p's Percent, or -1 when it is nil.
func percentOr(p jobs.JobPhase) int {
	if p.Percent == nil {
		return -1
	}
	return *p.Percent
}

// show writes a phase with its percentage (not the pointer to it).
func show(p jobs.JobPhase) string {
	return fmt.Sprintf("%s %d/%d %d%% ETA %gs events %d/%d", p.Phase, p.Step, p.Steps, percentOr(p), p.PhaseETASeconds, p.EventsDone, p.EventsTotal)
}

// TestProgressShowsPhases: the lines written to a log and the bars drawn
// on a terminal name each phase with its progress and ETA, for a rebuild
// (orderd rebuild -wait) and a verify (orderd verify -wait) alike.
func TestProgressShowsPhases(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 5, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		kind string
		run  []struct {
			at  time.Time
			job jobs.Job
		}
		lines []string
	}{
		{"rebuild", rebuildRun(t0), []string{
			"1/3 planning",
			"1/3 scanning: 25 streams, 250 events, 50 events/s, scanning ETA 15s",
			"2/3 verifying: 500 of 1000 events verified, verifying ETA 20s",
			"3/3 switching: verified; reads move to order_summaries_2",
			"rebuild succeeded",
		}},
		{"verify", verifyRun(t0), []string{
			"verify running, 1/1 verifying: 0 streams, 0 events, 60 events/s",
			"verify running, 1/1 verifying: 30 streams, 300 events, 60 events/s, verifying ETA 15s",
			"verify running, 1/1 verifying: 60 streams, 600 events, 60 events/s, verifying ETA 10s",
			"verify succeeded",
		}},
	} {
		for _, tty := range []bool{false, true} {
			var out bytes.Buffer
			var now time.Time
			p := &progress{w: &out, kind: c.kind, tty: tty, now: func() time.Time { return now }}
			for _, s := range c.run {
				now = s.at
				p.show(s.job)
			}
			p.end()
			got := out.String()
			t.Logf("%s, tty %v:\n%s", c.kind, tty, got)
			for _, want := range c.lines {
				if !strings.Contains(got, want) {
					t.Errorf("%s, tty %v: output lacks %q", c.kind, tty, want)
				}
			}
			percent := map[bool][]string{false: {"[25 %]", "[50 %]"}, true: {" 25%", " 50%", "100%"}}[tty]
			for _, want := range percent {
				if !strings.Contains(got, want) {
					t.Errorf("%s, tty %v: output lacks %q", c.kind, tty, want)
				}
			}
		}
	}
}
