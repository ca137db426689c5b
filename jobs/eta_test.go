package jobs

import (
	"math"
	"testing"
	"time"
)

// TestETAFromTheScan: a rebuild's rate and ETA are its scan's. A plan
// that took 8 s to cut the log (and the settling after it) does not
// count: 6 % of the commits read in the scan's first 2 s leaves 31 s,
// not the 2 min 36 s the job's whole age would give. The scan's first
// seconds give no ETA at all, and a finished scan's rate ends with it.
func TestETAFromTheScan(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	job := func(now float64, parts ...Task) Job {
		j := Job{Kind: KindRebuild, State: StateRunning, CreatedAt: t0, Partitions: len(parts), TotalCommits: 1000}
		j.Tasks = append([]Task{{Name: taskPlan, State: taskDone, StartedAt: at(0), FinishedAt: at(8)}}, parts...)
		j.Tasks = append(j.Tasks, Task{Name: taskFinish, State: taskPending})
		j.count(at(now))
		return j
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 0.01 }

	j := job(9, Task{Name: "part-0", State: taskRunning, StartedAt: at(8), Commits: 30, Events: 60})
	if j.ETASeconds != 0 || !near(j.RatePerSecond, 60) {
		t.Errorf("1 s into the scan: ETA %v s, rate %v/s; want no ETA yet, 60 events/s", j.ETASeconds, j.RatePerSecond)
	}
	if !j.StartedAt.Equal(t0) {
		t.Errorf("started at %v, want the plan's start %v", j.StartedAt, t0)
	}

	j = job(10, Task{Name: "part-0", State: taskRunning, StartedAt: at(8), Commits: 60, Events: 120})
	if want := 940.0 / 30; !near(j.ETASeconds, want) || !near(j.RatePerSecond, 60) {
		t.Errorf("2 s into the scan, 6 %% read: ETA %v s, rate %v/s; want %.2f s at 60 events/s", j.ETASeconds, j.RatePerSecond, want)
	}
	if p := j.PhaseAt(at(10)); p.Phase != "scanning" || p.PercentOr(-1) != 6 || p.PhaseETASeconds != 31 {
		t.Errorf("phase %+v, want scanning 6 %%, 31 s to go", p)
	}

	// Two partitions, one done: the scan runs from the first start to
	// now.
	j = job(12,
		Task{Name: "part-0", State: taskDone, StartedAt: at(8), FinishedAt: at(10), Commits: 200, Events: 400},
		Task{Name: "part-1", State: taskRunning, StartedAt: at(8.5), Commits: 200, Events: 400})
	if want := 600.0 / 100; !near(j.ETASeconds, want) || !near(j.RatePerSecond, 200) {
		t.Errorf("one of two partitions done: ETA %v s, rate %v/s; want %.2f s at 200 events/s", j.ETASeconds, j.RatePerSecond, want)
	}

	// Scanned, now verifying: the rate is the scan's, and stays so.
	j = job(60,
		Task{Name: "part-0", State: taskDone, StartedAt: at(8), FinishedAt: at(12), Commits: 500, Events: 1000},
		Task{Name: "part-1", State: taskDone, StartedAt: at(8), FinishedAt: at(13), Commits: 500, Events: 1000})
	if j.ETASeconds != 0 || !near(j.RatePerSecond, 400) {
		t.Errorf("scan over: ETA %v s, rate %v/s; want none, 400 events/s", j.ETASeconds, j.RatePerSecond)
	}

	// Planning: nothing scanned, no rate, no ETA.
	j = job(5)
	if j.ETASeconds != 0 || j.RatePerSecond != 0 {
		t.Errorf("planning: ETA %v s, rate %v/s; want neither", j.ETASeconds, j.RatePerSecond)
	}
}
