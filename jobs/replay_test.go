package jobs_test

import (
	"errors"
	"testing"
	"time"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectortest"
	"github.com/orderd/orderd/jobs"
)

// TestReplayKeepsMessageIDs republishes one stream and then a recorded-time
// range of the log: every message carries its event's id as Nats-Msg-Id,
// so the stream's de-duplication window keeps one message per event.
func TestReplayKeepsMessageIDs(t *testing.T) {
	ctx, b, db, es := projectortest.Start(t, 60*time.Second)
	k, f := newKit(t, ctx, es, db, "rpl", 6, 2)
	k.republish = bus.NewPublisher(b.JS, b.Stream).Republish
	k.worker(t, "w1", jobs.WorkerConfig{})

	replay := func(spec jobs.ReplaySpec) jobs.Job {
		t.Helper()
		job, err := k.jobs.StartReplay(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		job = k.waitJob(t, ctx, job.ID, 20*time.Second)
		if job.State != jobs.StateSucceeded {
			t.Fatalf("replay %+v: %s %s", spec, job.State, job.Error)
		}
		return job
	}
	one := f.IDs[2]
	if job := replay(jobs.ReplaySpec{StreamID: one}); job.Events != int64(len(f.Events[one])) {
		t.Errorf("replay of %s published %d events, want %d", one, job.Events, len(f.Events[one]))
	}
	if got := b.Messages(t, ctx); got != uint64(len(f.Events[one])) {
		t.Errorf("stream holds %d messages after replaying %s, want %d", got, one, len(f.Events[one]))
	}
	all := replay(jobs.ReplaySpec{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	if all.Events != int64(len(f.Flat)) || all.Streams != int64(len(f.IDs)) {
		t.Errorf("range replay published %d events of %d streams, want %d of %d", all.Events, all.Streams, len(f.Flat), len(f.IDs))
	}
	n := b.Messages(t, ctx)
	if n != uint64(len(f.Flat)) {
		t.Errorf("stream holds %d messages, want %d: one per event", n, len(f.Flat))
	}
	st, err := b.JS.Stream(ctx, b.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, e := range f.Flat {
		ids[e.ID] = true
	}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		e, err := domain.UnmarshalEvent(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if id := m.Header.Get("Nats-Msg-Id"); id != e.ID || !ids[id] {
			t.Errorf("message %d: Nats-Msg-Id %q for event %s", seq, id, e.ID)
		}
		delete(ids, e.ID)
	}
	if len(ids) > 0 {
		t.Errorf("events not republished: %v", ids)
	}
	if _, err := k.jobs.StartReplay(ctx, jobs.ReplaySpec{StreamID: "a.b"}); !errors.Is(err, domain.ErrValidation) {
		t.Errorf("replay of an invalid stream id: %v", err)
	}
}
