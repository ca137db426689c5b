package projection_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// memLog is a log of whole streams held in memory, or one answering err.
type memLog struct {
	streams map[string][]domain.Event
	err     error
	reads   int
}

func (l *memLog) LoadFrom(_ context.Context, id string, from int64) ([]domain.Event, error) {
	l.reads++
	if l.err != nil {
		return nil, l.err
	}
	var out []domain.Event
	for _, e := range l.streams[id] {
		if e.Version >= from {
			out = append(out, e)
		}
	}
	return out, nil
}

func lifeEvents(id string, datas ...domain.EventData) []domain.Event {
	at := time.Date(2024, 3, 1, 9, 0, 0, 0, time.UTC)
	out := make([]domain.Event, len(datas))
	for i, d := range datas {
		v := int64(i + 1)
		out[i] = domain.Event{ID: fmt.Sprintf("%s-e%d", id, v), StreamID: id, StreamType: domain.StreamTypeOrder, Type: d.EventType(),
			Version: v, OccurredAt: at.Add(time.Duration(v) * time.Hour), RecordedAt: at.Add(time.Duration(v) * time.Hour), Data: d}
	}
	return out
}

func TestAdvance(t *testing.T) {
	placed := domain.OrderPlaced{CustomerID: "c", Currency: "BRL", Items: []domain.Line{{SKU: "a", Quantity: 1, UnitPriceCents: 100}}}
	evs := lifeEvents("o-1", placed, domain.OrderApproved{}, domain.OrderShipped{}, domain.OrderDelivered{})
	whole, _, err := projection.OrderSummaries.Fold(evs)
	if err != nil {
		t.Fatal(err)
	}
	atV2, _, _ := projection.OrderSummaries.Fold(evs[:2])
	def := projection.OrderSummaries
	for _, tc := range []struct {
		name      string
		doc       domain.Order
		given     []domain.Event
		logErr    error
		wantV     int64 // the step's document's version (0: nothing to store)
		wantN     int
		out       projection.Outcome
		poison    error // errors.Is of Step.Poison, nil for none
		reached   int64
		wantErr   error
		wantReads int
	}{
		{name: "in order", given: evs, wantV: 4, wantN: 4},
		{name: "shuffled with duplicates", given: []domain.Event{evs[3], evs[0], evs[2], evs[0], evs[1]}, wantV: 4, wantN: 4}, // a duplicate within the delivery is not one of the stored document
		{name: "all stored already", doc: whole, given: evs[1:3], out: projection.Outcome{Duplicates: 2}},
		{name: "a gap filled from the log", doc: atV2, given: evs[3:], wantV: 4, wantN: 2, out: projection.Outcome{GapsFilled: 1}, wantReads: 1},
		{name: "a gap the log does not cover", given: append(evs[3:], lifeEvents("o-1", placed, placed, placed, placed, domain.OrderApproved{})[4]),
			out: projection.Outcome{GapsFilled: 1}, poison: nil, reached: 0, wantReads: 1},
		{name: "a gap read that will fail again", given: evs[2:], logErr: domain.ErrUnreadableCommit, poison: domain.ErrUnreadableCommit, wantReads: 1},
		{name: "a gap read that may pass", given: evs[2:], logErr: domain.ErrUnavailable, wantErr: domain.ErrUnavailable, wantReads: 1},
		{name: "an event the fold refuses", given: []domain.Event{evs[0], evs[1], lifeEvents("o-1", placed, placed, domain.OrderDelivered{})[2]},
			wantV: 2, wantN: 2, poison: domain.ErrInvalidTransition, reached: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &memLog{streams: map[string][]domain.Event{"o-1": evs}, err: tc.logErr}
			step, out, err := def.Advance(context.Background(), log, "o-1", tc.doc, tc.given)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if step.Events != tc.wantN || (tc.wantN > 0 && step.Doc.Version != tc.wantV) {
				t.Errorf("step folded %d events to v%d, want %d to v%d", step.Events, step.Doc.Version, tc.wantN, tc.wantV)
			}
			if out != tc.out {
				t.Errorf("outcome %+v, want %+v", out, tc.out)
			}
			if log.reads != tc.wantReads {
				t.Errorf("%d log reads, want %d", log.reads, tc.wantReads)
			}
			switch {
			case tc.name == "a gap the log does not cover":
				if step.Poison == nil || step.Poison.Reached != 0 {
					t.Errorf("poison %v, want one at v0", step.Poison)
				}
			case tc.poison == nil:
				if step.Poison != nil {
					t.Errorf("poison %v, want none", step.Poison)
				}
			case step.Poison == nil || !errors.Is(step.Poison, tc.poison) || step.Poison.Reached != tc.reached:
				t.Errorf("poison %v, want %v reached at v%d", step.Poison, tc.poison, tc.reached)
			}
			if tc.wantV == 4 && step.Doc.Version == 4 && step.Doc.Status != whole.Status {
				t.Errorf("document %+v, want the fold of the log %+v", step.Doc, whole)
			}
		})
	}
}
