package domain

import (
	"fmt"
	"time"
)

// MaxIDLength bounds order, customer and SKU ids, in bytes.
const MaxIDLength = 64

// ValidateID checks that id is 1..MaxIDLength bytes of [A-Za-z0-9_-]. Ids are
// used as MongoDB keys and NATS subject tokens, so nothing else is allowed:
// no '.', '$', '*', '>', whitespace or non-ASCII. Returns an error wrapping
// ErrValidation.
func ValidateID(kind, id string) error {
	if len(id) == 0 || len(id) > MaxIDLength {
		return fmt.Errorf("%s %q: must be 1 to %d characters: %w", kind, truncate(id), MaxIDLength, ErrValidation)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%s %q: only letters, digits, '_' and '-' are allowed: %w", kind, truncate(id), ErrValidation)
		}
	}
	return nil
}

func validID(id string) bool { return ValidateID("", id) == nil }

func truncate(s string) string {
	if len(s) > MaxIDLength {
		return s[:MaxIDLength] + "..."
	}
	return s
}

// Timestamp normalizes t to UTC with millisecond precision, the precision of
// a BSON date. Every time in an event passes through it, so an event decoded
// from the log and the same event decoded from its JSON message are equal.
func Timestamp(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// ValidTime reports whether t, in UTC, falls in years 1 to 9999: the range
// every time of an event must have so its JSON form can be written again.
func ValidTime(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}
