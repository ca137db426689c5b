package main

import (
	"time"

	"github.com/orderd/orderd/internal/embedded"
)

// StoreBusy returns how long the embedded store's single writer has been
// busy since the start (embedded.Store.WriteBusy); ok is false on MongoDB.
func (m *Main) StoreBusy() (busy time.Duration, ok bool) {
	s, ok := m.devStore.(*embedded.Store)
	if !ok {
		return 0, false
	}
	return s.WriteBusy(), true
}

// StoreWrites returns, by kind ("<command> <collection>"), how many writes
// the embedded store's single writer ran since the start and how long they
// held it (embedded.Store.WriteCosts); nil on MongoDB.
func (m *Main) StoreWrites() map[string]WriteCost {
	s, ok := m.devStore.(*embedded.Store)
	if !ok {
		return nil
	}
	out := map[string]WriteCost{}
	for k, c := range s.WriteCosts() {
		out[k.Command+" "+k.Collection] = c
	}
	return out
}

// WriteCost is what writes of one kind took of the embedded store's writer.
type WriteCost = embedded.WriteCost
