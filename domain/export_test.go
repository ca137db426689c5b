package domain

import "encoding/json"

// MarshalEnvelopeByReflection is MarshalEnvelope through json.Marshal
// alone: the bytes its written path must give.
func MarshalEnvelopeByReflection(e Event, data json.RawMessage) ([]byte, error) {
	return json.Marshal(eventJSON{Event: e, Data: data, Metadata: e.Metadata})
}
