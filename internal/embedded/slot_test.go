package embedded

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
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

func TestWriteClasses(t *testing.T) {
	one, two := bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "_id", Value: 2}}
	cases := []struct {
		what string
		name string
		msg  []byte
		want writeClass
	}{
		{"append: insert of one document, in a sequence", "insert",
			opMsgOf(t, bson.D{{Key: "insert", Value: "events"}, {Key: "$db", Value: "d"}}, "documents", one), classInsert},
		{"insert of one document, in the body", "insert",
			opMsgOf(t, bson.D{{Key: "insert", Value: "events"}, {Key: "documents", Value: bson.A{one}}, {Key: "$db", Value: "d"}}, ""), classInsert},
		{"group commit: insert of several commits into the log", "insert",
			opMsgOf(t, bson.D{{Key: "insert", Value: LogCollection}, {Key: "ordered", Value: false}, {Key: "$db", Value: "d"}}, "documents", one, two), classInsert},
		{"bulk insert", "insert",
			opMsgOf(t, bson.D{{Key: "insert", Value: "shadow"}, {Key: "$db", Value: "d"}}, "documents", one, two), classBulk},
		{"read-model write", "findandmodify",
			opMsgOf(t, bson.D{{Key: "findAndModify", Value: "order_summaries"}, {Key: "$db", Value: "d"}}, ""), classUpdate},
		{"lease claim: update of one statement", "update",
			opMsgOf(t, bson.D{{Key: "update", Value: "leases"}, {Key: "$db", Value: "d"}}, "updates", one), classUpdate},
		{"update of the log, two statements: no class of its own (the log is insert-only)", "update",
			opMsgOf(t, bson.D{{Key: "update", Value: "events"}, {Key: "$db", Value: "d"}}, "updates", one, two), classBulk},
		{"unguarded update of two statements elsewhere", "update",
			opMsgOf(t, bson.D{{Key: "update", Value: "jobs"}, {Key: "$db", Value: "d"}}, "updates", one, two), classBulk},
		{"delete of one statement", "delete",
			opMsgOf(t, bson.D{{Key: "delete", Value: "x"}, {Key: "deletes", Value: bson.A{one}}, {Key: "$db", Value: "d"}}, ""), classUpdate},
		{"index creation", "createindexes",
			opMsgOf(t, bson.D{{Key: "createIndexes", Value: "x"}, {Key: "$db", Value: "d"}}, ""), classBulk},
		{"a truncated message", "insert", opMsgOf(t, bson.D{{Key: "insert", Value: "x"}}, "documents", one)[:40], classBulk},
	}
	for _, c := range cases {
		cmd, _ := parseCommand(c.msg)
		if got := classOf(c.name, cmd); got != c.want {
			t.Errorf("%s: class %d, want %d", c.what, got, c.want)
		}
	}
}

// TestWriteSlotOrder: writes waiting for a held slot get it by class, and
// by arrival when they have all waited maxWait (0 here); one at a time.
func TestWriteSlotOrder(t *testing.T) {
	arrivals := []writeClass{classBulk, classUpdate, classBulk, classInsert, classUpdate}
	for _, tc := range []struct {
		name    string
		maxWait time.Duration
		want    []int // indexes into arrivals
	}{
		{"by class", time.Hour, []int{3, 1, 4, 0, 2}},
		{"by arrival once waited", 0, []int{0, 1, 2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &writeSlot{maxWait: tc.maxWait}
			s.acquire(classBulk)
			var (
				mu      sync.Mutex
				order   []int
				holders int
				wg      sync.WaitGroup
			)
			for i, c := range arrivals {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.acquire(c)
					mu.Lock()
					holders++
					if holders > 1 {
						t.Errorf("write %d holds the slot with another", i)
					}
					order = append(order, i)
					holders--
					mu.Unlock()
					s.release()
				}()
				// Let it queue before the next one arrives.
				deadline := time.Now().Add(10 * time.Second)
				for queued := false; !queued; {
					if time.Now().After(deadline) {
						t.Fatalf("write %d did not queue within 10s", i)
					}
					runtime.Gosched()
					s.mu.Lock()
					queued = slices.ContainsFunc(s.waiting[c], func(w *slotWaiter) bool { return w != nil }) && waiters(s) == i+1
					s.mu.Unlock()
				}
			}
			s.release()
			wg.Wait()
			if !slices.Equal(order, tc.want) {
				t.Fatalf("served %v, want %v", order, tc.want)
			}
			if s.busy {
				t.Fatal("the slot is still busy after the last release")
			}
		})
	}
}

func waiters(s *writeSlot) int {
	n := 0
	for _, q := range s.waiting {
		n += len(q)
	}
	return n
}

// TestWriteSlotBusyTime: the busy time is the time the slot was held, by
// one write after another and by the one holding it now, and none of the
// time it stood free.
func TestWriteSlotBusyTime(t *testing.T) {
	s := &writeSlot{maxWait: maxWriteWait}
	hold := func(d time.Duration) {
		s.acquire(classUpdate)
		time.Sleep(d)
		s.release()
	}
	start := time.Now()
	hold(20 * time.Millisecond)
	time.Sleep(50 * time.Millisecond) // free: not counted
	hold(20 * time.Millisecond)
	got, total := s.busyTime(), time.Since(start)
	if got < 40*time.Millisecond || got > total-50*time.Millisecond {
		t.Fatalf("busy %v after two writes of 20ms around 50ms free (%v in all), want at least 40ms and not the free time", got, total)
	}
	s.acquire(classUpdate)
	time.Sleep(10 * time.Millisecond)
	if now := s.busyTime(); now < got+10*time.Millisecond {
		t.Errorf("busy %v while a write holds the slot, want at least %v", now, got+10*time.Millisecond)
	}
	s.release()
}
