package http

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/labstack/echo/v4"
)

// timestampLayout is how every timestamp of the API is written: UTC, with
// milliseconds always three digits, so that the strings have one width
// and sort as the times do. time.Time's own JSON (RFC 3339 with
// nanoseconds) drops trailing zeros: ".45Z" beside ".457Z".
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

// timestampKeys are the names of the properties the document declares
// date-time (openapi.json): the keys whose values encodeJSON rewrites.
var timestampKeys = func() map[string]bool {
	var doc any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		panic("openapi.json: " + err.Error())
	}
	keys := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for name, p := range props {
					if dateTime(p) {
						keys[name] = true
					}
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return keys
}()

// dateTime reports whether the schema s is a date-time string, or one of
// its alternatives is (a nullable time).
func dateTime(s any) bool {
	m, ok := s.(map[string]any)
	if !ok {
		return false
	}
	if m["format"] == "date-time" {
		return true
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		alts, _ := m[k].([]any)
		for _, a := range alts {
			if dateTime(a) {
				return true
			}
		}
	}
	return false
}

// encodeJSON is json.Marshal with each timestamp (a string value of a key
// in timestampKeys that is an RFC 3339 time) written in timestampLayout,
// truncated to the millisecond. It reads the compact JSON that
// json.Marshal writes: a value is a string just after the ':' that
// follows its key.
func encodeJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out []byte // nil until the first rewrite
	done := 0      // b[:done] is in out
	var key []byte
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		end, escaped := i+1, false
		for ; end < len(b) && b[end] != '"'; end++ {
			if b[end] == '\\' {
				escaped = true
				end++
			}
		}
		s := b[i+1 : min(end, len(b))]
		switch {
		case end+1 < len(b) && b[end+1] == ':':
			key = s
		case i > 0 && b[i-1] == ':' && !escaped && timestampKeys[string(key)]:
			t, err := time.Parse(time.RFC3339Nano, string(s))
			if err != nil {
				break
			}
			if out == nil {
				out = make([]byte, 0, len(b)+len(b)/8)
			}
			out = append(out, b[done:i+1]...)
			out = t.UTC().AppendFormat(out, timestampLayout)
			done = end
		}
		i = end
	}
	if out == nil {
		return b, nil
	}
	return append(out, b[done:]...), nil
}

// jsonSerializer is echo's JSON encoding through encodeJSON.
type jsonSerializer struct{ echo.DefaultJSONSerializer }

func (jsonSerializer) Serialize(c echo.Context, v any, indent string) error {
	b, err := encodeJSON(v)
	if err != nil {
		return err
	}
	if indent != "" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", indent); err != nil {
			return err
		}
		b = buf.Bytes()
	}
	_, err = c.Response().Write(append(b, '\n'))
	return err
}
