package eventstore_test

import (
	"testing"

	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
)

func TestConformance(t *testing.T) {
	storetest.RunConformance(t, func(t *testing.T) *eventstore.Store {
		s, _ := storetest.OpenStore(t)
		return s
	})
}

func TestAtomicity(t *testing.T) {
	storetest.RunAtomicity(t, storetest.AtomicityConfig{})
}
