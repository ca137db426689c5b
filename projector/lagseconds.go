package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lagSeconds returns, at now, the lag in seconds of the partition whose
// consumer info describes: 0 when it has nothing unacknowledged, else the
// time since the newest event the partition has applied was recorded (its
// recorded_at), read from the message at the consumer's ack floor in st.
// That bounds from above how stale the partition's documents can be:
// what it has not applied was recorded later. A partition that has
// applied nothing yet (or whose floor message the stream no longer holds)
// counts from its oldest pending event. Errors: the message cannot be
// read or does not carry a recorded_at.
func lagSeconds(ctx context.Context, st jetstream.Stream, info *jetstream.ConsumerInfo, now time.Time) (float64, error) {
	if unacked(info) == 0 {
		return 0, nil
	}
	var (
		seq = info.AckFloor.Stream
		msg *jetstream.RawStreamMsg
		err error
	)
	if seq > 0 {
		msg, err = st.GetMsg(ctx, seq)
	}
	if seq == 0 || err != nil {
		msg, err = st.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(info.Config.FilterSubject))
	}
	if err != nil {
		return 0, fmt.Errorf("consumer %s: message at stream sequence %d: %w", info.Name, seq, err)
	}
	var e struct {
		RecordedAt time.Time `json:"recorded_at"`
	}
	if err := json.Unmarshal(msg.Data, &e); err != nil || e.RecordedAt.IsZero() {
		return 0, fmt.Errorf("consumer %s: message %d has no recorded_at", info.Name, msg.Sequence)
	}
	return max(now.Sub(e.RecordedAt), 0).Seconds(), nil
}
