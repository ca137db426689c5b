package domain

import "errors"

// ErrLeaseLost: a lease's holder was deposed (its lease expired and
// another holder claimed it, or it released it), so its renewal, release
// or fenced write was refused.
var ErrLeaseLost = errors.New("lease lost")
