package outbox

import "time"

// RelayStatus is the outbox relay as the store holds it: the instance
// holding the relay lease and until when, and the checkpoint it saved
// last (the recorded time of the last commit it covers, and when it was
// saved). Owner is "" and the times zero before any relay started.
type RelayStatus struct {
	Owner      string    `json:"owner,omitempty"`
	Epoch      int64     `json:"epoch,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// CheckpointRecordedAt is the recorded time of the last commit the
	// checkpoint covers (for an idle relay, a time before its stream's
	// position); every commit recorded before it less the catch-up margin
	// was published.
	CheckpointRecordedAt time.Time `json:"checkpoint_recorded_at,omitzero"`
	CheckpointSavedAt    time.Time `json:"checkpoint_saved_at,omitzero"`
}
