package embedded

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/FerretDB/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// opMsgOf builds an OP_MSG with body as its kind-0 section and, when seq
// is named, a kind-1 document sequence of docs under that identifier, as
// the Go driver sends a write's statements.
func opMsgOf(t *testing.T, body bson.D, seq string, docs ...bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, headerLen, 1024)
	binary.LittleEndian.PutUint32(msg[12:], uint32(wire.OpCodeMsg))
	msg = binary.LittleEndian.AppendUint32(msg, 0) // flags
	msg = append(msg, 0)
	msg = append(msg, b...)
	if seq != "" {
		sec := append([]byte(seq), 0)
		for _, d := range docs {
			db, err := bson.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			sec = append(sec, db...)
		}
		msg = append(msg, 1)
		msg = binary.LittleEndian.AppendUint32(msg, uint32(4+len(sec)))
		msg = append(msg, sec...)
	}
	binary.LittleEndian.PutUint32(msg, uint32(len(msg)))
	return msg
}

// TestWriteSlotBusyTime: the busy time is the time the slot was held, by
// one write after another and by the one holding it now, and none of the
// time it stood free.
func TestWriteSlotBusyTime(t *testing.T) {
	s := &writeSlot{}
	hold := func(d time.Duration) {
		asked := time.Now()
		s.acquire()
		time.Sleep(d)
		s.release("insert", "c", asked)
	}
	start := time.Now()
	hold(20 * time.Millisecond)
	time.Sleep(50 * time.Millisecond) // free: not counted
	hold(20 * time.Millisecond)
	got, total := s.busyTime(), time.Since(start)
	if got < 40*time.Millisecond || got > total-50*time.Millisecond {
		t.Fatalf("busy %v after two writes of 20ms around 50ms free (%v in all), want at least 40ms and not the free time", got, total)
	}
	s.acquire()
	time.Sleep(10 * time.Millisecond)
	if now := s.busyTime(); now < got+10*time.Millisecond {
		t.Errorf("busy %v while a write holds the slot, want at least %v", now, got+10*time.Millisecond)
	}
	s.release("insert", "c", time.Now())
}

// TestWriteSlotCountsTheWait: a write's wait for the slot, from when it
// asked to when it got it, is counted under its kind, apart from the
// time it held the slot.
func TestWriteSlotCountsTheWait(t *testing.T) {
	s := &writeSlot{}
	s.acquire()
	s.release("update", "order_summaries_v2", time.Now())
	asked := time.Now().Add(-time.Second) // as if queued behind a second of writes
	s.acquire()
	s.release("update", "order_summaries", asked)
	c := s.costs()[WriteKind{"update", "order_summaries"}]
	if c.Writes != 2 || c.Waited < time.Second || c.Waited > c.Held+2*time.Second {
		t.Fatalf("costs %+v; want 2 writes that waited about a second in all", c)
	}
	if busy := s.busyTime(); busy >= time.Second {
		t.Errorf("busy %v: the wait counted as time held", busy)
	}
}
