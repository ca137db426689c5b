package lease

import "time"

// Lease is one holder's claim of a named lease (invariant 6: one job,
// one runner). Epoch is the fencing token: every claim raises it, so a
// holder that was deposed presents an epoch older than the lease's, and
// the store refuses its renewals, its release and every write fenced by
// it. Times are the holder's clock, taken before the write was sent, so
// the holder's idea of its deadline is never later than the stored one.
// The relay holds one for its log, the jobs one per task; a deposed
// holder's write fails with domain.ErrLeaseLost.
type Lease struct {
	Name       string    // the lease's name, unique within its store
	Holder     string    // who holds it: an instance or runner id
	Epoch      int64     // fencing token: 1 for the first claim, one more for each claim after
	AcquiredAt time.Time // when this claim was sent
	RenewedAt  time.Time // when the last renewal that got through was sent (AcquiredAt before any)
	ExpiresAt  time.Time // RenewedAt plus the TTL; zero for a lease nobody ever held
}
