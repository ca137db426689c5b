package domain

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
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

// OrderIDNamespace is the namespace of the order ids derived from
// idempotency keys (KeyedOrderID). It is fixed: changing it would give the
// retries of requests already answered new ids.
const OrderIDNamespace = "d1aa2ca1-7d46-403c-8eb9-74719571fcd0"

// orderIDNamespace is OrderIDNamespace's 16 bytes (TestKeyedOrderID
// compares KeyedOrderID with a UUID library's).
var orderIDNamespace, _ = hex.DecodeString(strings.ReplaceAll(OrderIDNamespace, "-", ""))

// KeyedOrderID returns the order id of a PlaceOrder that names no order
// id but carries an idempotency key: the name-based UUID, version 5
// (SHA-1; RFC 9562 §5.5), of key in OrderIDNamespace, in the canonical
// 36-character form. It is what uuid.NewSHA1 of github.com/google/uuid
// returns; domain imports only the standard library, so it is computed
// here. Every retry of the request gets the same id, so it lands on the
// same stream and collides there with the commit that holds the key.
func KeyedOrderID(key string) string {
	h := sha1.New()
	h.Write(orderIDNamespace)
	h.Write([]byte(key))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
