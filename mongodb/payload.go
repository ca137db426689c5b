package mongodb

import (
	"bytes"
	"errors"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// payloadJSON is the JSON of a stored payload (a BSON document made from
// the payload's JSON at append, toBSON), as bson.MarshalExtJSON gives it
// in relaxed form: what a load decodes and the relay publishes. The
// values a payload's JSON turns into, strings with nothing to escape, 32-
// and 64-bit integers, booleans, null, documents and arrays, are written
// here; a payload holding any other (a double, a string to escape) takes
// bson.MarshalExtJSON as a whole. The driver's writer, a fmt.Sprintf per
// element, took 3.2 µs for a one-line order's payload against 1.0 µs here
// (BenchmarkPayloadJSON), a third of the 9.7 µs the relay spent turning
// its commit into the wire form.
func payloadJSON(doc bson.Raw) ([]byte, error) {
	if b, ok := appendJSON(make([]byte, 0, len(doc)), bsoncore.Document(doc), false); ok {
		return b, nil
	}
	return bson.MarshalExtJSON(doc, false, false)
}

// appendJSON appends doc as a JSON object (as an array with array);
// false when it holds a value it does not write.
func appendJSON(b []byte, doc bsoncore.Document, array bool) ([]byte, bool) {
	open, end := byte('{'), byte('}')
	if array {
		open, end = '[', ']'
	}
	b = append(b, open)
	first := true
	err := eachElement(doc, func(key []byte, v bsoncore.Value) error {
		if !first {
			b = append(b, ',')
		}
		first = false
		ok := true
		if !array {
			if b, ok = appendString(b, key); !ok {
				return errNotWritten
			}
			b = append(b, ':')
		}
		switch v.Type {
		case bsoncore.TypeString:
			b, ok = appendString(b, v.StringValue())
		case bsoncore.TypeInt32:
			b = strconv.AppendInt(b, int64(v.Int32()), 10)
		case bsoncore.TypeInt64:
			b = strconv.AppendInt(b, v.Int64(), 10)
		case bsoncore.TypeBoolean:
			b = strconv.AppendBool(b, v.Boolean())
		case bsoncore.TypeNull:
			b = append(b, "null"...)
		case bsoncore.TypeEmbeddedDocument:
			b, ok = appendJSON(b, v.Document(), false)
		case bsoncore.TypeArray:
			b, ok = appendJSON(b, bsoncore.Document(v.Array()), true)
		default:
			ok = false
		}
		if !ok {
			return errNotWritten
		}
		return nil
	})
	if err != nil {
		return nil, false
	}
	return append(b, end), true
}

// errNotWritten stops appendJSON's walk at a value it does not write.
var errNotWritten = errors.New("a value payloadJSON does not write")

// eachElement calls fn with the key and value of each of doc's elements,
// in order, until fn returns an error, which it returns; an error too when
// doc is malformed. bsoncore's Elements builds their list first, growing
// it one element at a time: a fifth of the relay's decoding
// (BenchmarkChangedCommit's CPU profile).
func eachElement(doc bsoncore.Document, fn func(key []byte, v bsoncore.Value) error) error {
	length, rem, ok := bsoncore.ReadLength(doc)
	if !ok || length < 5 || int(length) > len(doc) || doc[length-1] != 0 {
		return bsoncore.NewInsufficientBytesError(doc, rem)
	}
	rem = doc[4 : length-1]
	for len(rem) > 0 {
		var e bsoncore.Element
		if e, rem, ok = bsoncore.ReadElement(rem); !ok {
			return bsoncore.NewInsufficientBytesError(doc, rem)
		}
		// ReadElement found the key's end: e[1:end] is the key.
		end := 1 + bytes.IndexByte(e[1:], 0)
		v := bsoncore.Value{Type: bsoncore.Type(e[0]), Data: e[end+1:]}
		if err := v.Validate(); err != nil {
			return err
		}
		if err := fn(e[1:end], v); err != nil {
			return err
		}
	}
	return nil
}

// appendString appends s quoted when it needs no escape in JSON.
func appendString[S string | []byte](b []byte, s S) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			return nil, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
