package domain

import "encoding/json"

// MarshalEnvelopeByReflection is MarshalEnvelope through json.Marshal
// alone: the bytes its written path must give.
func MarshalEnvelopeByReflection(e Event, data json.RawMessage) ([]byte, error) {
	return json.Marshal(eventJSON{
		ID: e.ID, StreamID: e.StreamID, StreamType: e.StreamType, Type: e.Type, Version: e.Version,
		OccurredAt: e.OccurredAt, RecordedAt: e.RecordedAt, Data: data, Metadata: e.Metadata,
	})
}
