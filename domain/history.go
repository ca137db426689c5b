package domain

import "time"

// History is what the admin service sampled of the projections and the
// relay, oldest sample first, one every IntervalSeconds, over the last
// WindowSeconds: kept in the memory of the instance that answers, so it
// starts empty when that instance starts.
type History struct {
	IntervalSeconds float64         `json:"interval_seconds"`
	WindowSeconds   float64         `json:"window_seconds"`
	Samples         []HistorySample `json:"samples"`
}

// HistorySample is one sample: when it was taken, each projection, and
// the relay.
type HistorySample struct {
	At          time.Time          `json:"at"`
	Projections []ProjectionSample `json:"projections"`
	Relay       RelaySample        `json:"relay"`
}

// ProjectionSample is one projection at a sample. Null fields are
// unknown (no NATS connection, or JetStream did not answer).
type ProjectionSample struct {
	Name string `json:"name"`
	// Lag is the messages its consumers have not yet acknowledged,
	// summed over its partitions.
	Lag *uint64 `json:"lag"`
	// LagSeconds is the largest partition's lag in seconds (0 when
	// nothing is pending; see PartitionStatus.LagSeconds).
	LagSeconds *float64 `json:"lag_seconds"`
	// ApplyRate is events per second acknowledged since the previous
	// sample (the change of the ack floor); null in the first sample.
	ApplyRate *float64 `json:"apply_rate"`
	LastError string   `json:"last_error,omitempty"`
}

// RelaySample is the outbox relay at a sample.
type RelaySample struct {
	Owner string `json:"owner,omitempty"` // "" when no instance holds the relay lease
	// CheckpointAgeSeconds is the seconds from the recorded time of the
	// last commit the relay's checkpoint covers to the sample (an idle
	// relay moves it every 30 s); null before any checkpoint.
	CheckpointAgeSeconds *float64 `json:"checkpoint_age_seconds"`
	// Catchups counts the relay's catch-ups from the log since the
	// answering process started (orderd_relay_catchups_total); null when
	// that process runs no relay.
	Catchups *float64 `json:"catchups"`
}
