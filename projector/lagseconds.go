package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lagClock measures a partition's lag in seconds: 0 when its consumer has
// nothing unacknowledged, else the time since the newest event the
// partition has applied was recorded (its recorded_at), read from the
// message at the consumer's ack floor. That bounds from above how stale
// the partition's documents can be: what it has not applied was recorded
// later. A partition that has applied nothing yet (or whose floor message
// the stream no longer holds) counts from its oldest pending event. The
// recorded_at of each consumer's floor is remembered, so a stalled
// partition costs no read per sample. Safe for concurrent use.
type lagClock struct {
	mu    sync.Mutex
	floor map[string]floorTime // by consumer name
}

// floorTime is the recorded_at of the message at stream sequence seq.
type floorTime struct {
	seq uint64
	at  time.Time
}

func newLagClock() *lagClock { return &lagClock{floor: map[string]floorTime{}} }

// seconds returns partition lag in seconds at now of the consumer info
// describes, reading at most one message of st. Errors: the message
// cannot be read or does not carry a recorded_at.
func (l *lagClock) seconds(ctx context.Context, st jetstream.Stream, info *jetstream.ConsumerInfo, now time.Time) (float64, error) {
	if unacked(info) == 0 {
		return 0, nil
	}
	seq := info.AckFloor.Stream
	l.mu.Lock()
	f, ok := l.floor[info.Name]
	l.mu.Unlock()
	if !ok || f.seq != seq || seq == 0 {
		at, err := l.recordedAt(ctx, st, info, seq)
		if err != nil {
			return 0, err
		}
		f = floorTime{seq: seq, at: at}
		if seq > 0 {
			l.mu.Lock()
			l.floor[info.Name] = f
			l.mu.Unlock()
		}
	}
	return max(now.Sub(f.at), 0).Seconds(), nil
}

// recordedAt reads the recorded_at of the message at seq, or, when seq is
// 0 or gone, of the first message after it on the consumer's subjects.
func (l *lagClock) recordedAt(ctx context.Context, st jetstream.Stream, info *jetstream.ConsumerInfo, seq uint64) (time.Time, error) {
	var (
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
		return time.Time{}, fmt.Errorf("consumer %s: message at stream sequence %d: %w", info.Name, seq, err)
	}
	var e struct {
		RecordedAt time.Time `json:"recorded_at"`
	}
	if err := json.Unmarshal(msg.Data, &e); err != nil || e.RecordedAt.IsZero() {
		return time.Time{}, fmt.Errorf("consumer %s: message %d has no recorded_at", info.Name, msg.Sequence)
	}
	return e.RecordedAt, nil
}
