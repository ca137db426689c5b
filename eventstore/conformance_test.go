package eventstore_test

import (
	"os"
	"testing"

	"github.com/orderd/orderd/eventstore"
	"github.com/orderd/orderd/eventstore/storetest"
)

// TestConformance runs the suite on both sides of the dialect seam: the
// embedded store's paths, and MongoDB's (correct on any store, only slower
// on the embedded one).
func TestConformance(t *testing.T) {
	for _, d := range []eventstore.Dialect{eventstore.MongoDB, eventstore.FerretDB} {
		t.Run(d.String(), func(t *testing.T) {
			storetest.RunConformance(t, func(t *testing.T) *eventstore.Store {
				s, db := storetest.OpenStore(t)
				eventstore.UseDialect(db.Client(), d)
				return s
			})
		})
	}
}

func TestAtomicity(t *testing.T) {
	storetest.RunAtomicity(t, storetest.AtomicityConfig{})
}

// TestScanMethods runs the scan part of the suite with each way of reading
// the log in order, whichever store MONGODB_URI names (ScanAuto picks one),
// and with ScanByID in passes of a few ids.
func TestScanMethods(t *testing.T) {
	for name, opts := range map[string][]eventstore.Option{
		"sorted": {eventstore.WithScanMethod(eventstore.ScanSorted)},
		"by-id":  {eventstore.WithScanMethod(eventstore.ScanByID)},
		// Passes of 1 to 3 ids: a stream of two commits straddles every
		// cut of 1 and most cuts of 3.
		"by-id-passes-of-1": {eventstore.WithScanMethod(eventstore.ScanByID), eventstore.WithIDBudget(1)},
		"by-id-passes-of-3": {eventstore.WithScanMethod(eventstore.ScanByID), eventstore.WithIDBudget(3)},
	} {
		t.Run(name, func(t *testing.T) {
			storetest.RunScan(t, func(t *testing.T) *eventstore.Store {
				s, _ := storetest.OpenStore(t, opts...)
				return s
			})
		})
	}
}

// TestDialectOf: the embedded store (no MONGODB_URI) is told apart from
// MongoDB by its buildInfo answer, once per client.
func TestDialectOf(t *testing.T) {
	_, db := storetest.OpenStore(t)
	got, err := eventstore.DialectOf(t.Context(), db.Client())
	if err != nil {
		t.Fatal(err)
	}
	want := eventstore.MongoDB
	if os.Getenv("MONGODB_URI") == "" {
		want = eventstore.FerretDB
	}
	if got != want {
		t.Fatalf("DialectOf = %s, want %s", got, want)
	}
}

// TestScanAuto: on the embedded store (no MONGODB_URI), which sorts in
// memory, ScanAuto reads by id; on another server it reads sorted.
func TestScanAuto(t *testing.T) {
	s, _ := storetest.OpenStore(t)
	got, err := eventstore.ResolvedScanMethod(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	want := eventstore.ScanSorted
	if os.Getenv("MONGODB_URI") == "" {
		want = eventstore.ScanByID
	}
	if got != want {
		t.Fatalf("ScanAuto resolved to %d, want %d", got, want)
	}
}
