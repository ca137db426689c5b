package mongodb_test

import (
	"testing"

	"github.com/orderd/orderd/mongodb/storetest"
)

// TestChangeStreamConformance runs the change-stream suite on the test
// store: the embedded one, whose funnel serves change streams, or the
// server MONGODB_URI names (a replica set: MongoDB serves change streams
// on replica sets and sharded clusters only).
func TestChangeStreamConformance(t *testing.T) {
	storetest.RunChangeStream(t)
}
