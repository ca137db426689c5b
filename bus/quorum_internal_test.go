package bus

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestQuorumCountsTheConfiguredReplicas: a stream at R3 whose leader
// lists, while the cluster replaces a lost peer, the lost peer beside its
// successor has a quorum when the leader and one current replica answer;
// it has none with the leader alone current.
func TestQuorumCountsTheConfiguredReplicas(t *testing.T) {
	info := func(current ...bool) *jetstream.StreamInfo {
		var rs []*jetstream.PeerInfo
		for i, c := range current {
			rs = append(rs, &jetstream.PeerInfo{Name: string(rune('a' + i)), Current: c, Offline: !c})
		}
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Replicas: 3}, Cluster: &jetstream.ClusterInfo{Leader: "l", Replicas: rs}}
	}
	if err := quorum("ORDERS", info(true, false, false)); err != nil {
		t.Errorf("leader and one current replica of three, a lost peer listed too: %v; want a quorum", err)
	}
	if err := quorum("ORDERS", info(false, false, false)); err == nil {
		t.Error("leader alone current: a quorum; want none")
	}
	if err := quorum("ORDERS", info(true, true)); err != nil {
		t.Errorf("all three current: %v", err)
	}
}
