package http_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/orderd/orderd/domain"
)

// fixedWidth is the one shape of a timestamp in an answer.
var fixedWidth = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// timestamps returns every string in the JSON document v, by key, that
// parses as an RFC 3339 time.
func timestamps(t *testing.T, body []byte) map[string][]string {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	out := map[string][]string{}
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(k, x)
			}
		case []any:
			for _, x := range v {
				walk(key, x)
			}
		case string:
			if _, err := time.Parse(time.RFC3339Nano, v); err == nil {
				out[key] = append(out[key], v)
			}
		}
	}
	walk("", v)
	return out
}

// TestTimestampsFixedWidth: every timestamp of an answer has one width,
// milliseconds always three digits, in UTC, whether the time falls on a
// whole second, has trailing zeros, or was sent with another offset and
// more digits; a string that only looks like a time (a cancel's reason)
// is sent as it was given.
func TestTimestampsFixedWidth(t *testing.T) {
	recorded := []time.Time{
		time.Date(2026, 11, 27, 10, 0, 54, 450_000_000, time.UTC),
		time.Date(2026, 11, 27, 10, 0, 55, 0, time.UTC),
		time.Date(2026, 11, 27, 10, 0, 55, 457_000_000, time.UTC),
	}
	e := newEnv(t)
	e.store.Now = func() time.Time {
		now := recorded[0]
		if len(recorded) > 1 {
			recorded = recorded[1:]
		}
		return now
	}
	const reason = "2026-11-27T10:00:54.4Z"
	if rec := e.post(t, "/v1/orders", placeBodyWith("times-1", `"customer_id": "c-1", "currency": "BRL", "items": [{"sku": "s", "quantity": 1, "unit_price_cents": 100}], "at": "2026-11-27T07:00:54.4-03:00"`)); rec.Code != http.StatusCreated {
		t.Fatalf("place: %d %s", rec.Code, rec.Body)
	}
	if rec := e.post(t, "/v1/orders/times-1/approve", `{"at": "2026-11-27T10:00:55.123456789Z"}`); rec.Code != http.StatusOK {
		t.Fatalf("approve: %d %s", rec.Code, rec.Body)
	}
	if rec := e.post(t, "/v1/orders/times-1/cancel", `{"reason": "`+reason+`"}`); rec.Code != http.StatusOK {
		t.Fatalf("cancel: %d %s", rec.Code, rec.Body)
	}
	e.reads.put(domain.Order{ID: "times-1", CustomerID: "c-1", Currency: "BRL", Status: domain.StatusCreated, Version: 1,
		UpdatedAt: time.Date(2026, 11, 27, 10, 0, 54, 0, time.UTC), RecordedAt: time.Date(2026, 11, 27, 10, 0, 54, 450_000_000, time.UTC)})

	want := map[string]map[string][]string{
		"/v1/orders/times-1/events": {
			"occurred_at": {"2026-11-27T10:00:54.400Z", "2026-11-27T10:00:55.123Z", ""},
			"recorded_at": {"2026-11-27T10:00:54.450Z", "2026-11-27T10:00:55.000Z", "2026-11-27T10:00:55.457Z"},
			"reason":      {reason},
		},
		"/v1/orders/times-1": {
			"placed_at":   {"2026-11-27T10:00:54.400Z"},
			"approved_at": {"2026-11-27T10:00:55.123Z"},
			"recorded_at": {"2026-11-27T10:00:55.457Z"},
		},
		"/v1/order-summaries/times-1": {
			"updated_at":  {"2026-11-27T10:00:54.000Z"},
			"recorded_at": {"2026-11-27T10:00:54.450Z"},
		},
	}
	for path, keys := range want {
		rec := e.get(t, path)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		got := timestamps(t, rec.Body.Bytes())
		for key, vs := range got {
			for _, v := range vs {
				if key != "reason" && !fixedWidth.MatchString(v) {
					t.Errorf("GET %s: %s %q is not 2006-01-02T15:04:05.000Z", path, key, v)
				}
			}
		}
		for key, vs := range keys {
			for i, v := range vs {
				if v == "" { // the cancel's time is the receive time
					continue
				}
				if i >= len(got[key]) || got[key][i] != v {
					t.Errorf("GET %s: %s = %q, want %q at %d", path, key, got[key], v, i)
				}
			}
		}
	}
}

// TestTimestampsPretty: ?pretty indents the answer and keeps the
// timestamps' width.
func TestTimestampsPretty(t *testing.T) {
	e := newEnv(t)
	e.reads.put(domain.Order{ID: "pretty-1", CustomerID: "c-1", Currency: "BRL", Status: domain.StatusCreated, Version: 1,
		UpdatedAt: time.Date(2026, 11, 27, 10, 0, 54, 0, time.UTC)})
	rec := e.get(t, "/v1/order-summaries/pretty-1?pretty")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body)
	}
	if got := timestamps(t, rec.Body.Bytes())["updated_at"]; len(got) != 1 || got[0] != "2026-11-27T10:00:54.000Z" {
		t.Errorf("updated_at %q in %s", got, rec.Body)
	}
	if !regexp.MustCompile(`\n  "`).Match(rec.Body.Bytes()) {
		t.Errorf("?pretty is not indented: %s", rec.Body)
	}
}
