package mongodb

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/orderd/orderd/domain"
)

// commitDoc is the stored form of a commit, never changed after its
// insert (invariant 2). ID is CommitID(stream, first version). Commits
// that earlier versions appended also hold an outbox marker (published,
// published_at), which this version neither writes nor reads but for
// OldestUnpublished.
type commitDoc struct {
	ID             string     `bson:"_id"`
	StreamID       string     `bson:"stream_id"`
	StreamType     string     `bson:"stream_type"`
	FirstVersion   int64      `bson:"first_version"`
	LastVersion    int64      `bson:"last_version"`
	Events         []eventDoc `bson:"events"`
	RecordedAt     time.Time  `bson:"recorded_at"`
	IdempotencyKey string     `bson:"idempotency_key,omitempty"`
	RequestHash    string     `bson:"request_hash,omitempty"`
}

// eventDoc is one event inside a commit; Data is the payload's JSON
// converted to a BSON document, so operators can read it in any client.
type eventDoc struct {
	ID            string    `bson:"event_id"`
	Type          string    `bson:"type"`
	Version       int64     `bson:"version"`
	OccurredAt    time.Time `bson:"occurred_at"`
	RecordedAt    time.Time `bson:"recorded_at"`
	Data          bson.Raw  `bson:"data"`
	CorrelationID string    `bson:"correlation_id,omitempty"`
	CausationID   string    `bson:"causation_id,omitempty"`
	SchemaVersion int       `bson:"schema_version"`
}

// UnmarshalBSON decodes a stored commit as bson.Unmarshal's reflection
// does for the values this package stores (strings, integers, dates, the
// payloads' documents) and for null, which leaves a field at its zero
// value; a field holding another type is an error, and unknown fields
// (the outbox marker of earlier versions) are skipped. The reflection took
// 2.7 µs of the 6 µs the relay spent on a one-event commit
// (BenchmarkChangedCommit, its CPU profile), and every load pays it too.
func (d *commitDoc) UnmarshalBSON(b []byte) error {
	b = slices.Clone(b) // the payloads are slices of it
	*d = commitDoc{}
	return eachElement(b, func(key []byte, v bsoncore.Value) (err error) {
		switch string(key) {
		case "_id":
			err = decodeValue(v, &d.ID)
		case "stream_id":
			err = decodeValue(v, &d.StreamID)
		case "stream_type":
			err = decodeValue(v, &d.StreamType)
		case "first_version":
			err = decodeValue(v, &d.FirstVersion)
		case "last_version":
			err = decodeValue(v, &d.LastVersion)
		case "recorded_at":
			err = decodeValue(v, &d.RecordedAt)
		case "idempotency_key":
			err = decodeValue(v, &d.IdempotencyKey)
		case "request_hash":
			err = decodeValue(v, &d.RequestHash)
		case "events":
			d.Events, err = decodeEvents(v)
		}
		if err != nil {
			return fmt.Errorf("decode commit field %s: %w", key, err)
		}
		return nil
	})
}

// decodeEvents decodes a commit's array of events (UnmarshalBSON).
func decodeEvents(v bsoncore.Value) ([]eventDoc, error) {
	if v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("a %s is not an array", v.Type)
	}
	var out []eventDoc
	err := eachElement(bsoncore.Document(arr), func(_ []byte, ev bsoncore.Value) error {
		doc, ok := ev.DocumentOK()
		if !ok {
			return fmt.Errorf("event %d: a %s is not a document", len(out), ev.Type)
		}
		out = append(out, eventDoc{})
		e := &out[len(out)-1]
		return eachElement(doc, func(key []byte, v bsoncore.Value) (err error) {
			switch string(key) {
			case "event_id":
				err = decodeValue(v, &e.ID)
			case "type":
				err = decodeValue(v, &e.Type)
			case "version":
				err = decodeValue(v, &e.Version)
			case "occurred_at":
				err = decodeValue(v, &e.OccurredAt)
			case "recorded_at":
				err = decodeValue(v, &e.RecordedAt)
			case "data":
				err = decodeValue(v, &e.Data)
			case "correlation_id":
				err = decodeValue(v, &e.CorrelationID)
			case "causation_id":
				err = decodeValue(v, &e.CausationID)
			case "schema_version":
				var n int64
				err = decodeValue(v, &n)
				e.SchemaVersion = int(n)
			}
			if err != nil {
				return fmt.Errorf("event %d field %s: %w", len(out)-1, key, err)
			}
			return nil
		})
	})
	return out, err
}

// decodeValue sets *dst (a *string, *int64, *time.Time or *bson.Raw) to
// v as the driver's reflection would: an integer from an int32, an int64
// or a whole double, a date in UTC, a document's or an array's bytes; null
// leaves it as it is.
func decodeValue(v bsoncore.Value, dst any) error {
	if v.Type == bsoncore.TypeNull {
		return nil
	}
	ok := false
	switch p := dst.(type) {
	case *string:
		*p, ok = v.StringValueOK()
	case *int64:
		switch v.Type {
		case bsoncore.TypeInt32, bsoncore.TypeInt64:
			*p, ok = v.AsInt64OK()
		case bsoncore.TypeDouble:
			f := v.Double()
			*p, ok = int64(f), f == math.Trunc(f) && math.Abs(f) <= 1<<63
		}
	case *time.Time:
		var ms int64
		if ms, ok = v.DateTimeOK(); ok {
			*p = time.UnixMilli(ms).UTC()
		}
	case *bson.Raw: // a document, or an array as the driver takes it
		if ok = v.Type == bsoncore.TypeEmbeddedDocument || v.Type == bsoncore.TypeArray; ok {
			*p = bson.Raw(v.Data)
		}
	}
	if !ok {
		return fmt.Errorf("a %s does not decode into a %T", v.Type, dst)
	}
	return nil
}

// decodeCommit decodes the stored commit raw. One that does not decode
// comes back with only its id and stream id, and an error wrapping
// domain.ErrUnreadableCommit and the decoder's: reading it again will not
// help.
func decodeCommit(raw bson.Raw) (commitDoc, error) {
	var d commitDoc
	if err := d.UnmarshalBSON(raw); err != nil {
		id, _ := raw.Lookup("_id").StringValueOK()
		return commitDoc{ID: id, StreamID: streamOf(id)}, fmt.Errorf("read commit %s: %w: %v", id, domain.ErrUnreadableCommit, err)
	}
	return d, nil
}

// CommitID is the _id of the commit of stream that starts at version
// first: "<stream id>:<first version, 10 digits>". Deterministic ids make
// every read of a stream a chain of _id look-ups, the one query FerretDB
// 1.24 on SQLite hands to SQLite instead of decoding the whole collection,
// and give the (stream_id, first_version) guard a second, primary-key
// line of defence.
func CommitID(streamID string, first int64) string {
	return fmt.Sprintf("%s:%010d", streamID, first)
}

func newCommitDoc(c domain.Commit, now time.Time) (commitDoc, error) {
	// One command's events (Check): the log's correlation index holds
	// one key per commit, and the embedded store indexes the first
	// event's.
	if err := c.Check(); err != nil {
		return commitDoc{}, err
	}
	doc := commitDoc{
		ID: CommitID(c.StreamID, c.ExpectedVersion+1), StreamID: c.StreamID, StreamType: c.StreamType,
		FirstVersion: c.ExpectedVersion + 1, LastVersion: c.LastVersion(),
		RecordedAt: now, IdempotencyKey: c.IdempotencyKey, RequestHash: c.RequestHash,
	}
	for _, e := range c.Events {
		data, err := toBSON(e.Data, e.Metadata.SchemaVersion)
		if err != nil {
			return commitDoc{}, fmt.Errorf("append %s v%d: %w", c.StreamID, e.Version, err)
		}
		doc.Events = append(doc.Events, eventDoc{
			ID: e.ID, Type: e.Type, Version: e.Version, OccurredAt: domain.Timestamp(e.OccurredAt), RecordedAt: now,
			Data: data, CorrelationID: e.Metadata.CorrelationID, CausationID: e.Metadata.CausationID,
			SchemaVersion: e.Metadata.SchemaVersion,
		})
	}
	return doc, nil
}

// toBSON converts a payload to a BSON document. It first decodes the
// payload's JSON as a reader will, so nothing is stored that Load would
// then refuse (a reason too long, an unknown schema version).
func toBSON(d domain.EventData, schemaVersion int) (bson.Raw, error) {
	js, err := domain.EncodeData(d)
	if err != nil {
		return nil, err
	}
	if _, err := domain.DecodeData(d.EventType(), schemaVersion, js); err != nil {
		return nil, err
	}
	var doc bson.D
	if err := bson.UnmarshalExtJSON(js, false, &doc); err != nil {
		return nil, fmt.Errorf("convert %s payload to BSON: %w", d.EventType(), err)
	}
	return bson.Marshal(doc)
}

// events decodes the commit's events. Errors wrap
// domain.ErrUnreadableCommit and the decoder's error (domain.ErrUnknownEvent
// for a type or schema version this build does not know,
// domain.ErrValidation for a payload that does not decode).
func (d commitDoc) events() ([]domain.Event, error) {
	out := make([]domain.Event, 0, len(d.Events))
	for _, e := range d.Events {
		js, err := payloadJSON(e.Data)
		if err != nil {
			return nil, fmt.Errorf("read %s v%d payload: %w: %w", d.StreamID, e.Version, domain.ErrUnreadableCommit, err)
		}
		data, err := domain.DecodeData(e.Type, e.SchemaVersion, js)
		if err != nil {
			return nil, fmt.Errorf("read %s v%d: %w: %w", d.StreamID, e.Version, domain.ErrUnreadableCommit, err)
		}
		out = append(out, domain.Event{
			ID: e.ID, StreamID: d.StreamID, StreamType: d.StreamType, Type: e.Type, Version: e.Version,
			OccurredAt: e.OccurredAt.UTC(), RecordedAt: e.RecordedAt.UTC(), Data: data,
			Metadata: domain.Metadata{CorrelationID: e.CorrelationID, CausationID: e.CausationID, SchemaVersion: e.SchemaVersion},
		})
	}
	return out, nil
}

// recorded is the commit as the outbox publishes it: each event's wire
// form made from its stored payload, which was checked when appended,
// without decoding it (MarshalEnvelope); an event of a type or schema
// version this build does not know makes the commit unreadable (Err).
func (d commitDoc) recorded() domain.RecordedCommit {
	c := domain.RecordedCommit{ID: d.ID, StreamID: d.StreamID, FirstVersion: d.FirstVersion, RecordedAt: d.RecordedAt, Count: len(d.Events)}
	for _, e := range d.Events {
		c.CorrelationID = cmp.Or(c.CorrelationID, e.CorrelationID)
		body, err := d.message(e)
		if err != nil {
			c.Events, c.Err = nil, fmt.Errorf("read %s v%d: %w: %w", d.StreamID, e.Version, domain.ErrUnreadableCommit, err)
			return c
		}
		c.Events = append(c.Events, domain.EventMessage{ID: e.ID, Body: body})
	}
	return c
}

// message is the wire form of e, an event of the commit.
func (d commitDoc) message(e eventDoc) ([]byte, error) {
	if err := domain.CheckSchema(e.Type, e.SchemaVersion); err != nil {
		return nil, err
	}
	data, err := payloadJSON(e.Data)
	if err != nil {
		return nil, err
	}
	return domain.MarshalEnvelope(domain.Event{
		ID: e.ID, StreamID: d.StreamID, StreamType: d.StreamType, Type: e.Type, Version: e.Version,
		OccurredAt: e.OccurredAt.UTC(), RecordedAt: e.RecordedAt.UTC(),
		Metadata: domain.Metadata{CorrelationID: e.CorrelationID, CausationID: e.CausationID, SchemaVersion: e.SchemaVersion},
	}, data)
}
