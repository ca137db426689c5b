package projector

import (
	"context"
	"time"
)

// DefaultPartitions is how many partitions a projection's events are
// split into when RunnerConfig.Partitions is 0.
const DefaultPartitions = 16

// Partitions are the leases of one projection's partitions, numbered from
// 0 (invariant 6): each is held by one process at a time, under an epoch
// that every claim raises, so a deposed holder's renewal and release are
// refused. The MongoDB adapter's *mongodb.Partitions implements it. Its
// errors are domain.ErrUnavailable when the store cannot be reached, and
// those named below.
type Partitions interface {
	// Ensure creates the leases of partitions 0..n-1 that do not exist.
	Ensure(ctx context.Context, n int) error
	// List returns the leases of partitions 0..n-1, element p being
	// partition p's.
	List(ctx context.Context, n int) ([]Lease, error)
	// Claim takes partition p for holder for ttl if it is free, has
	// expired, or is holder's; false and no error when another holder
	// has it.
	Claim(ctx context.Context, p int, holder string, ttl time.Duration) (Lease, bool, error)
	// Renew extends leases by ttl, all in one round trip, and returns
	// those still held, renewed.
	Renew(ctx context.Context, leases []Lease, ttl time.Duration) ([]Lease, error)
	// Release frees a lease; domain.ErrLeaseLost when it had passed to
	// another ownership.
	Release(ctx context.Context, lease Lease) error
	// Remove deletes the leases of every partition, for a version of the
	// projection that no process runs any more.
	Remove(ctx context.Context) error
}

// Members are the processes consuming one projection's partitions, from
// one process's side: each heartbeats for one lease TTL, and the live ones
// share the partitions. The MongoDB adapter's *mongodb.Members implements
// it; its errors are domain.ErrUnavailable.
type Members interface {
	// Heartbeat announces this process as a live member for one TTL,
	// with what it applied in the partitions it holds.
	Heartbeat(ctx context.Context, reports []PartitionReport) error
	// Leave removes this process from the members at once.
	Leave(ctx context.Context) error
	// Live returns the members whose heartbeat has not expired, sorted by
	// owner.
	Live(ctx context.Context) ([]Member, error)
}

// fairShare is how many of n partitions the member at index i of m live
// members (sorted by owner) should hold: n/m, plus one for the first n%m
// members, so the shares add up to n and differ by at most one (the range
// assignment of Kafka's consumer groups).
func fairShare(n, m, i int) int {
	if m <= 0 {
		return n
	}
	s := n / m
	if i < n%m {
		s++
	}
	return s
}
