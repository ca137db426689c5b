package domain

import (
	"strings"
	"time"
)

// JobPhase is where a job is: the step it is in, how far that step is and
// when it should end. Jobs.Get (the job's own admin route) works it out
// from the job's tasks with Job.PhaseAt, and every other view of the job
// (the projections' status, the CLI, the console) shows it as given, so
// that they cannot disagree.
type JobPhase struct {
	// Phase is queued, planning, scanning, verifying, switching,
	// replaying, or the job's final state.
	Phase string `json:"phase,omitempty"`
	// Step is the 1-based step of Steps the phase is; both are 0 when
	// the job has no step (queued, final). A rebuild has 3 steps:
	// 1 planning then scanning, 2 verifying, 3 switching.
	Step  int `json:"phase_step,omitempty"`
	Steps int `json:"phase_steps,omitempty"`
	// Percent is how far the phase is, 0 to 100 (99 at most until it
	// ends); nil when unknown (queued, switching, a scan whose size is
	// not counted yet, a failed or canceled job).
	Percent *int `json:"phase_percent,omitempty"`
	// PhaseETASeconds is the time the phase should still take, in seconds, at
	// its rate so far; 0 when unknown.
	PhaseETASeconds float64 `json:"phase_eta_seconds,omitempty"`
	// EventsDone and EventsTotal are the events of this phase done and to
	// do (EventsTotal 0 when unknown).
	EventsDone  int64 `json:"phase_events_done,omitempty"`
	EventsTotal int64 `json:"phase_events_total,omitempty"`
}

// PercentOr returns Percent, or unknown when it is nil.
func (p JobPhase) PercentOr(unknown int) int {
	if p.Percent == nil {
		return unknown
	}
	return *p.Percent
}

func percent(n int) *int { return &n }

// PhaseAt works out a job's phase at now from its state, counters and
// tasks, as Jobs.Get fills them in. A rebuild scans the log into its
// shadow (its partitions, with the job's ETASeconds), then its finish
// task verifies the shadow against the sums the scan recorded (which
// count the events their documents reflect), or against the log when a
// partition recorded none (which folds the same events the scan did):
// either way the scan's count is the verify's total and the finish's own
// rate gives its ETA. It then switches reads to the shadow once it has
// recorded the collection it replaces. A verify or replay is one step.
func (j Job) PhaseAt(now time.Time) JobPhase {
	if j.State.Final() {
		p := JobPhase{Phase: string(j.State)}
		if j.State == StateSucceeded {
			p.Percent = percent(100)
		}
		return p
	}
	scan := JobPhase{Phase: "scanning", Step: 1, Steps: 1, EventsDone: j.Events}
	if j.ETASeconds > 0 && j.RatePerSecond > 0 {
		left := j.ETASeconds * j.RatePerSecond
		scan.Percent = percent(min(99, int(100*float64(j.Events)/(float64(j.Events)+left))))
		scan.PhaseETASeconds = time.Duration(j.ETASeconds * float64(time.Second)).Round(time.Second).Seconds()
		scan.EventsTotal = j.Events + int64(left)
	}
	switch j.Kind {
	case KindVerify:
		scan.Phase = "verifying"
	case KindReplay:
		scan.Phase = "replaying"
	case KindRebuild:
		scan.Steps = 3
		return j.rebuildPhase(scan, now)
	}
	if j.State == StateQueued && j.StartedAt.IsZero() {
		return JobPhase{Phase: "queued"}
	}
	return scan
}

func (j Job) rebuildPhase(scan JobPhase, now time.Time) JobPhase {
	plan, planned := j.Task("plan")
	if !planned || plan.State != "done" {
		if j.StartedAt.IsZero() {
			return JobPhase{Phase: "queued"}
		}
		return JobPhase{Phase: "planning", Step: 1, Steps: 3, Percent: percent(0)}
	}
	for _, t := range j.Tasks {
		if strings.HasPrefix(t.Name, "part-") && t.State != "done" {
			return scan
		}
	}
	if j.Replaced != "" {
		return JobPhase{Phase: "switching", Step: 3, Steps: 3}
	}
	v := JobPhase{Phase: "verifying", Step: 2, Steps: 3, Percent: percent(0), EventsTotal: j.Events}
	fin, ok := j.Task("finish")
	if !ok || fin.StartedAt.IsZero() {
		return v
	}
	v.EventsDone = fin.Events
	if j.Events > 0 {
		v.Percent = percent(int(min(99, 100*fin.Events/j.Events)))
	}
	if secs := now.Sub(fin.StartedAt).Seconds(); secs > 0 && fin.Events > 0 && j.Events > fin.Events {
		rate := float64(fin.Events) / secs
		v.PhaseETASeconds = time.Duration(float64(j.Events-fin.Events) / rate * float64(time.Second)).Round(time.Second).Seconds()
	}
	return v
}

// Summary is the job as a projection's status shows it: its id, state,
// error, phase and counters as Jobs.Get filled them in.
func (j Job) Summary() JobSummary {
	return JobSummary{Job: j.ID, State: j.State, Error: j.Error, JobPhase: j.JobPhase, StartedAt: j.StartedAt,
		Events: j.Events, RatePerSecond: j.RatePerSecond, ETASeconds: j.ETASeconds}
}
