package projector

import (
	"time"
)

// Member is one process among those consuming a projection's partitions:
// alive while its heartbeat's ExpiresAt is ahead, reporting what it
// applied in each partition it holds. The live members share the
// partitions.
type Member struct {
	Owner      string    // the process's instance id
	ExpiresAt  time.Time // its last heartbeat plus the lease TTL
	Partitions []PartitionReport
}

// PartitionReport is what a member reports of a partition it holds.
type PartitionReport struct {
	Partition int
	Applied   int64   // events applied in this claim
	Rate      float64 // events per second between the member's last two heartbeats
}
