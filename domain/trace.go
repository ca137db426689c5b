package domain

import (
	"encoding/binary"
	"hash/fnv"
)

// TraceIDs derives a trace id and a span id from a correlation id: its
// FNV-128a and FNV-64a hashes. Every process that handles a command or its
// events (the API, the relay, the projectors) starts its spans under this
// pair, so they form one trace without trace context being stored in the
// log: the event's correlation id is the link.
func TraceIDs(correlationID string) (traceID [16]byte, spanID [8]byte) {
	h := fnv.New128a()
	h.Write([]byte(correlationID))
	copy(traceID[:], h.Sum(nil))
	s := fnv.New64a()
	s.Write([]byte(correlationID))
	binary.BigEndian.PutUint64(spanID[:], s.Sum64())
	return traceID, spanID
}
