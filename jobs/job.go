package jobs

import (
	"math"
	"strings"
	"time"

	"github.com/orderd/orderd/projection"
)

// The jobs' vocabulary: jobs, their tasks and reports, and each
// projection's status, as the store keeps them and the admin API and the
// CLI show them.

// MaxPartitions bounds the partitions of one rebuild.
const MaxPartitions = 64

// JobKind is what a job does.
type JobKind string

// Job kinds.
const (
	KindRebuild JobKind = "rebuild" // rebuild a read model into a shadow collection and switch to it
	KindVerify  JobKind = "verify"  // compare a read model with the fold of the log, optionally repair
	KindReplay  JobKind = "replay"  // publish part of the log to NATS again
)

// JobState is where a job is.
type JobState string

// Job states; succeeded, failed and canceled are final.
const (
	StateQueued    JobState = "queued"
	StateRunning   JobState = "running"
	StateSucceeded JobState = "succeeded"
	StateFailed    JobState = "failed"
	StateCanceled  JobState = "canceled"
)

// Final reports whether s is a final state.
func (s JobState) Final() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCanceled
}

// ReplaySpec selects the part of the log a replay job publishes again: one
// stream, or every commit recorded in [From, To) (zero bounds do not
// limit).
type ReplaySpec struct {
	StreamID string    `json:"stream_id,omitempty"`
	From     time.Time `json:"from,omitzero"`
	To       time.Time `json:"to,omitzero"`
}

// Job is a rebuild, verify or replay job. Its progress is the sum of its
// tasks'.
type Job struct {
	ID           string                   `json:"id"`
	Kind         JobKind                  `json:"kind"`
	Projection   string                   `json:"projection,omitempty"`
	Version      int                      `json:"version,omitempty"` // of the projection's definition: built by a rebuild, checked by a verify
	State        JobState                 `json:"state"`
	CreatedAt    time.Time                `json:"created_at"`
	FinishedAt   time.Time                `json:"finished_at,omitzero"`
	Error        string                   `json:"error,omitempty"`
	Partitions   int                      `json:"partitions,omitempty"` // asked for, then as cut
	Shadow       string                   `json:"shadow_collection,omitempty"`
	Replaced     string                   `json:"replaced_collection,omitempty"` // the collection a rebuild switched away from
	Repair       bool                     `json:"repair,omitempty"`
	Replay       *ReplaySpec              `json:"replay,omitempty"`
	TotalCommits int64                    `json:"-"`
	Bounds       []string                 `json:"-"` // first stream of each partition but the first
	Report       *projection.VerifyReport `json:"report,omitempty"`

	// Filled in by Jobs.Get from the tasks.
	StartedAt       time.Time `json:"started_at,omitzero"`
	Events          int64     `json:"events_done"`
	Streams         int64     `json:"streams_done"`
	PoisonStreams   int64     `json:"poison_streams,omitempty"`
	RatePerSecond   float64   `json:"events_per_second"`
	ETASeconds      float64   `json:"eta_seconds,omitempty"`
	CancelRequested bool      `json:"cancel_requested,omitempty"`
	Tasks           []Task    `json:"tasks"`
	commits         int64     // read by the scan, of TotalCommits
	// JobPhase is where the job is (Job.PhaseAt at the time Jobs.Get
	// read it).
	JobPhase
}

// builds reports whether the job builds a shadow collection: a rebuild,
// or the verify of a rollup.
func (j Job) builds() bool { return j.Kind == KindRebuild || j.Shadow != "" }

// etaMinSample is how long a job's scan must have run before its rate
// gives an ETA: the first batches run on cold caches, slower than the
// rest.
const etaMinSample = 2 * time.Second

// count fills in the job's progress from its tasks at now: its state as
// they show it, when it started, the events and streams its scan (every
// task but a rebuild's plan and finish) has done, the scan's rate and its
// ETA. The rate is measured from the scan's first start, not the job's:
// a rebuild's plan (which may read every commit id to cut the log) and
// the settling time before its scan do not slow the estimate. The ETA is
// left out until the scan has run etaMinSample.
func (j *Job) count(now time.Time) {
	var scanStart, scanEnd time.Time
	scanning := false
	for _, t := range j.Tasks {
		if t.State == taskRunning && !j.State.Final() {
			j.State = StateRunning
		}
		if !t.StartedAt.IsZero() && (j.StartedAt.IsZero() || t.StartedAt.Before(j.StartedAt)) {
			j.StartedAt = t.StartedAt
		}
		if t.Name == taskFinish || t.Name == taskPlan {
			continue
		}
		j.Events += t.Events
		j.Streams += t.Streams
		j.PoisonStreams += t.Poison
		j.commits += t.Commits
		if t.StartedAt.IsZero() {
			continue
		}
		if scanStart.IsZero() || t.StartedAt.Before(scanStart) {
			scanStart = t.StartedAt
		}
		if t.FinishedAt.IsZero() {
			scanning = true
		} else if t.FinishedAt.After(scanEnd) {
			scanEnd = t.FinishedAt
		}
	}
	if scanStart.IsZero() {
		return
	}
	end := now
	switch {
	case scanning && !j.FinishedAt.IsZero():
		end = j.FinishedAt
	case !scanning:
		end = scanEnd
	}
	secs := end.Sub(scanStart).Seconds()
	if secs <= 0 {
		return
	}
	j.RatePerSecond = float64(j.Events) / secs
	if scanning && !j.State.Final() && j.commits > 0 && j.TotalCommits > j.commits && secs >= etaMinSample.Seconds() {
		j.ETASeconds = float64(j.TotalCommits-j.commits) / (float64(j.commits) / secs)
	}
}

// Task returns the job's task named name ("plan", "part-0", ..., "finish",
// "verify", "replay"), as filled in by Jobs.Get.
func (j Job) Task(name string) (Task, bool) {
	for _, t := range j.Tasks {
		if t.Name == name {
			return t, true
		}
	}
	return Task{}, false
}

// Task is one claimable unit of a job: a rebuild's plan (cut the log into
// partitions), a partition of its scan, its finish (verify, switch, clean
// up), or a whole verify or replay.
// Only its owner of the current epoch writes it.
type Task struct {
	ID         string    `json:"id"`
	Job        string    `json:"-"`
	Name       string    `json:"name"`
	From       string    `json:"from,omitempty"` // first stream of the partition
	To         string    `json:"to,omitempty"`   // first stream after it
	State      string    `json:"state"`          // pending, running, done, failed, canceled
	Owner      string    `json:"owner,omitempty"`
	Epoch      int64     `json:"epoch"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	Attempts   int       `json:"attempts"`
	Cursor     string    `json:"cursor,omitempty"` // last stream done
	Events     int64     `json:"events"`
	Streams    int64     `json:"streams"`
	Commits    int64     `json:"-"`
	Poison     int64     `json:"poison_streams,omitempty"`
	// Summed counts the streams of a rebuild partition whose sums its
	// scan recorded for the finish's verify; below Streams when a binary
	// that records none scanned part of it.
	Summed     int64     `json:"-"`
	Resumes    []Resume  `json:"resumes,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Error      string    `json:"error,omitempty"`
}

// Resume records a claim of a task that had already made progress: the
// cursor and counters the new owner started from.
type Resume struct {
	At      time.Time `json:"at"`
	Owner   string    `json:"owner"`
	Cursor  string    `json:"cursor"`
	Events  int64     `json:"events"`
	Streams int64     `json:"streams"`
}

// ProjectionStatus is one projection's read models and jobs, as the
// store holds them (the part of GET /v1/admin/projections that package
// admin does not add).
//
// Versions are those of the projection's definition: Version is the one
// the answering instance folds; ActiveVersion that of the collection
// readers read (0 before a first build), ShadowVersion that of a rebuild
// under way, PreviousVersion that of the collection a switch replaced,
// kept for a switch back during the rebuild grace.
type ProjectionStatus struct {
	Name               string    `json:"name"`
	Version            int       `json:"version"`
	ActiveCollection   string    `json:"active_collection"`
	ActiveVersion      int       `json:"active_version"`
	ShadowCollection   string    `json:"shadow_collection,omitempty"`
	ShadowVersion      int       `json:"shadow_version,omitempty"`
	PreviousCollection string    `json:"previous_collection,omitempty"`
	PreviousVersion    int       `json:"previous_version,omitempty"`
	SwitchedBackFrom   int       `json:"switched_back_from,omitempty"`
	SwitchedAt         time.Time `json:"switched_at,omitzero"`
	Generation         int64     `json:"generation"`
	// ConsumerLag is the messages not yet acknowledged by the consumers
	// of the version the answering instance folds (ConsumerLagVersion,
	// which is Version), summed over the partitions; nil when unknown.
	// While a deploy builds a new version that is the build's live feed,
	// not what readers read: ActiveLag and ShadowLag say which is which.
	ConsumerLag        *uint64 `json:"consumer_lag"`
	ConsumerLagVersion int     `json:"consumer_lag_version,omitempty"`
	// ActiveLag is the same count for the consumers of ActiveVersion,
	// which feed the collection readers read: how far reads are behind
	// the log. Nil when unknown or before a first build.
	ActiveLag *uint64 `json:"active_lag"`
	// ShadowLag is the same count for the consumers of ShadowVersion,
	// which feed the shadow a rebuild is building (besides its scan of
	// the log); nil when no rebuild runs or it is unknown. For a rebuild
	// of the active version it is ActiveLag: one set of consumers feeds
	// both collections.
	ShadowLag   *uint64        `json:"shadow_lag,omitempty"`
	LastError   string         `json:"last_error,omitempty"`
	DeadLetters int64          `json:"dead_letters"`
	LastVerify  *VerifySummary `json:"last_verify,omitempty"`
	LastRebuild *JobSummary    `json:"last_rebuild,omitempty"`
}

// VerifySummary is the outcome of a projection's latest verify job.
type VerifySummary struct {
	Job        string    `json:"job"`
	State      JobState  `json:"state"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Drift      int64     `json:"drift"`
	Repaired   int64     `json:"repaired"`
	Digest     string    `json:"digest,omitempty"`
}

// JobSummary is a job as a projection's status shows it (Job.Summary):
// its id, state and error, where it is (JobPhase), and its counters, all
// as the job's own admin route has them. Events is the events read so far
// (a rebuild's scan), RatePerSecond their rate in events per second, and
// ETASeconds the seconds its scan should still take (0 when unknown or
// over); JobPhase.PhaseETASeconds is the current phase's.
type JobSummary struct {
	Job   string   `json:"job"`
	State JobState `json:"state"`
	Error string   `json:"error,omitempty"`
	JobPhase
	StartedAt     time.Time `json:"started_at,omitzero"`
	Events        int64     `json:"events_done"`
	RatePerSecond float64   `json:"events_per_second"`
	ETASeconds    float64   `json:"eta_seconds,omitempty"`
}

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
	switch {
	case j.commits > 0 && j.TotalCommits > j.commits:
		// The events to read, at the events per commit read so far.
		scan.Percent = percent(min(99, int(100*j.commits/j.TotalCommits)))
		scan.EventsTotal = int64(float64(j.Events) * float64(j.TotalCommits) / float64(j.commits))
		scan.PhaseETASeconds = math.Round(j.ETASeconds)
	case j.ETASeconds > 0 && j.RatePerSecond > 0:
		// A job as its JSON gives it, without its commits: the events
		// left at its rate.
		left := j.ETASeconds * j.RatePerSecond
		scan.Percent = percent(min(99, int(100*float64(j.Events)/(float64(j.Events)+left))))
		scan.PhaseETASeconds = math.Round(j.ETASeconds)
		scan.EventsTotal = j.Events + int64(left)
	}
	switch {
	case j.builds():
		scan.Steps = 3
		return j.rebuildPhase(scan, now)
	case j.Kind == KindVerify:
		scan.Phase = "verifying"
	case j.Kind == KindReplay:
		scan.Phase = "replaying"
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
		v.PhaseETASeconds = math.Round(float64(j.Events-fin.Events) / rate)
	}
	return v
}

// Summary is the job as a projection's status shows it: its id, state,
// error, phase and counters as Jobs.Get filled them in.
func (j Job) Summary() JobSummary {
	return JobSummary{Job: j.ID, State: j.State, Error: j.Error, JobPhase: j.JobPhase, StartedAt: j.StartedAt,
		Events: j.Events, RatePerSecond: j.RatePerSecond, ETASeconds: j.ETASeconds}
}
