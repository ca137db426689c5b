package storetest

import (
	"fmt"
	"reflect"
	"time"

	"github.com/orderd/orderd/domain"
)

// NewCommit returns a commit of one event per payload for streamID at
// expected version: fresh event ids, versions expected+1.., one causation
// id (the commit's command id) for all of its events, schema version 1 and
// millisecond UTC times (domain.Timestamp), so a loaded event can be
// compared with the appended one field by field.
func NewCommit(streamID string, expected int64, data ...domain.EventData) domain.Commit {
	cmd := Unique("cmd-")
	at := domain.Timestamp(time.Now().Add(-time.Hour))
	c := domain.Commit{StreamID: streamID, StreamType: domain.StreamTypeOrder, ExpectedVersion: expected}
	for i, d := range data {
		c.Events = append(c.Events, domain.Event{
			ID: Unique("evt-") + Unique(""), StreamID: streamID, StreamType: domain.StreamTypeOrder,
			Type: d.EventType(), Version: expected + int64(i) + 1,
			OccurredAt: at.Add(time.Duration(i) * time.Second),
			Data:       d,
			Metadata:   domain.Metadata{CorrelationID: "corr-" + cmd, CausationID: cmd, SchemaVersion: 1},
		})
	}
	return c
}

// placed is a valid OrderPlaced with an amount over 2^31, so a payload
// that loses its int64 on the way through BSON shows.
func placed(customer string) domain.OrderPlaced {
	return domain.OrderPlaced{
		CustomerID: customer, Currency: "BRL", FreightCents: 1590,
		Items: []domain.Line{
			{SKU: "sku-1", Quantity: 2, UnitPriceCents: 4990},
			{SKU: "sku_2", Quantity: 1, UnitPriceCents: 1_000_000_000_000},
		},
	}
}

// recorded is what Load should return for c appended at recordedAt.
func recorded(c domain.Commit, recordedAt time.Time) []domain.Event {
	out := make([]domain.Event, len(c.Events))
	for i, e := range c.Events {
		e.OccurredAt = domain.Timestamp(e.OccurredAt)
		e.RecordedAt = recordedAt
		out[i] = e
	}
	return out
}

// DiffEvents describes the first difference between want and got, or
// returns "" when they are equal: every field alike (reflect.DeepEqual), so
// times must be the same instant in UTC.
func DiffEvents(want, got []domain.Event) string {
	if len(want) != len(got) {
		versions := make([]int64, len(got))
		for i, e := range got {
			versions[i] = e.Version
		}
		return fmt.Sprintf("%d events, want %d: got versions %v", len(got), len(want), versions)
	}
	for i := range want {
		if !reflect.DeepEqual(want[i], got[i]) {
			return fmt.Sprintf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	return ""
}
