package jobs

import (
	"context"

	"github.com/orderd/orderd/projection"
)

// Store keeps the jobs (JobRecords), their tasks (TaskRecords) and their
// leases (TaskLeases), and the rebuild locks (RebuildLocks). The MongoDB
// adapter's *mongodb.Jobs implements it. Besides the errors named below,
// every method fails with domain.ErrUnavailable when the store cannot be
// reached.
type Store interface {
	JobRecords
	TaskRecords
	TaskLeases
	RebuildLocks
}

// JobRecords keeps one record per job: its kind, bounds, state, cancel
// request and report.
type JobRecords interface {
	// InsertJob stores a new job.
	InsertJob(ctx context.Context, job Job) error
	// Job returns a job without its tasks, with its cancel request;
	// domain.ErrNotFound for an unknown id.
	Job(ctx context.Context, id string) (Job, error)
	// Latest returns the most recent job of a kind for a projection, or
	// nil.
	Latest(ctx context.Context, projection string, kind JobKind) (*Job, error)
	// SavePlan records a rebuild's bounds, commit count and partitions.
	SavePlan(ctx context.Context, job Job) error
	// RequestCancel records a cancel request unless the job has
	// committed to its switch, and reports whether it did.
	RequestCancel(ctx context.Context, id string) (bool, error)
	// CommitSwitch records what a rebuild's switch replaces, and its
	// verify report, unless a cancel was requested, and reports whether
	// it did.
	CommitSwitch(ctx context.Context, id, replaced string, report *projection.VerifyReport) (bool, error)
	// FinishJob writes a job's final state, error and report.
	FinishJob(ctx context.Context, id string, state JobState, errMsg string, report *projection.VerifyReport) error
}

// TaskRecords keeps the tasks a job is split into.
type TaskRecords interface {
	// InsertTasks stores tasks, keeping any that exists already.
	InsertTasks(ctx context.Context, tasks []Task) error
	// Tasks returns the tasks of a job.
	Tasks(ctx context.Context, job string) ([]Task, error)
	// OpenTasks returns the tasks of every job in one of states.
	OpenTasks(ctx context.Context, states ...string) ([]Task, error)
	// SetTasksState moves a job's tasks in state from to state to.
	SetTasksState(ctx context.Context, job, from, to string) error
}

// RebuildLocks keeps one lock per projection, held by the rebuild or
// verify job that writes its shadow.
type RebuildLocks interface {
	// Lock takes a projection's rebuild lock for a job;
	// domain.ErrJobRunning when another rebuild holds it.
	Lock(ctx context.Context, projection, job string) error
	// Unlock releases a projection's rebuild lock if the job holds it.
	Unlock(ctx context.Context, projection, job string) error
}
