package projector

import "time"

// PartitionStatus is one partition of a projection: its consumer, the
// process holding its lease and until when, and what the owner last
// reported at a renewal.
type PartitionStatus struct {
	Partition  int       `json:"partition"`
	Consumer   string    `json:"consumer"`
	Owner      string    `json:"owner,omitempty"` // "" when no process holds the lease
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	Epoch      int64     `json:"epoch,omitempty"` // the owner's fencing token: claims of the partition so far
	// Lag is the messages of the partition not yet acknowledged; null when
	// JetStream could not be asked.
	Lag *uint64 `json:"lag"`
	// LagSeconds is 0 when nothing is pending, else the seconds since the
	// newest event the partition has applied was recorded: a bound on how
	// stale its documents are. Null when JetStream could not be asked.
	LagSeconds *float64 `json:"lag_seconds"`
	Applied    int64    `json:"applied"`    // events the owner applied in this claim
	ApplyRate  float64  `json:"apply_rate"` // events per second the owner applied between its last two renewals
}
