package mongodb_test

import (
	"flag"
	"os"
	"testing"

	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
)

var chaosLong = flag.Bool("chaos.long", false, "run the atomicity races at the suite's full size (make chaos)")

// TestConformance runs the suite on both sides of the dialect seam: the
// whole suite on the store's own paths, and the part that depends on the
// paths on the other side (MongoDB's on the embedded store: correct there,
// only slower).
func TestConformance(t *testing.T) {
	native := mongodb.DialectFerretDB
	if os.Getenv("MONGODB_URI") != "" {
		native = mongodb.DialectMongoDB
	}
	for _, d := range []mongodb.Dialect{mongodb.DialectMongoDB, mongodb.DialectFerretDB} {
		t.Run(d.String(), func(t *testing.T) {
			run := storetest.RunReadPaths
			if d == native {
				run = storetest.RunConformance
			}
			run(t, func(t *testing.T) *mongodb.EventStore {
				s, db := storetest.OpenStore(t)
				mongodb.UseDialect(db.Client(), d)
				return s
			})
		})
	}
}

// TestAtomicity races conditional writes from two processes. FerretDB
// without the write funnel let several racers win in 964 to 990 of 1,000
// rounds (docs/embedded-store.md), so 250 rounds fail such
// a store for certain; 1,000 took 5 to 8 minutes under -race, most of
// make test. make chaos runs the suite's full 1,000.
func TestAtomicity(t *testing.T) {
	cfg := storetest.AtomicityConfig{Rounds: 250}
	if *chaosLong {
		cfg.Rounds = 0 // the suite's default
	}
	storetest.RunAtomicity(t, cfg)
}

// TestScanMethods runs the scan part of the suite with each way of reading
// the log in order, whichever store MONGODB_URI names (ScanAuto picks one),
// and with ScanByID in passes of a few ids.
func TestScanMethods(t *testing.T) {
	for name, opts := range map[string][]mongodb.EventStoreOption{
		"sorted": {mongodb.WithScanMethod(mongodb.ScanSorted)},
		"by-id":  {mongodb.WithScanMethod(mongodb.ScanByID)},
		// Passes of 1 to 3 ids: a stream of two commits straddles every
		// cut of 1 and most cuts of 3.
		"by-id-passes-of-1": {mongodb.WithScanMethod(mongodb.ScanByID), mongodb.WithIDBudget(1)},
		"by-id-passes-of-3": {mongodb.WithScanMethod(mongodb.ScanByID), mongodb.WithIDBudget(3)},
	} {
		t.Run(name, func(t *testing.T) {
			storetest.RunScan(t, func(t *testing.T) *mongodb.EventStore {
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
	got, err := mongodb.DialectOf(t.Context(), db.Client())
	if err != nil {
		t.Fatal(err)
	}
	want := mongodb.DialectMongoDB
	if os.Getenv("MONGODB_URI") == "" {
		want = mongodb.DialectFerretDB
	}
	if got != want {
		t.Fatalf("DialectOf = %s, want %s", got, want)
	}
}

// TestScanAuto: on the embedded store (no MONGODB_URI), which sorts in
// memory, ScanAuto reads by id; on another server it reads sorted.
func TestScanAuto(t *testing.T) {
	s, _ := storetest.OpenStore(t)
	got, err := mongodb.ResolvedScanMethod(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	want := mongodb.ScanSorted
	if os.Getenv("MONGODB_URI") == "" {
		want = mongodb.ScanByID
	}
	if got != want {
		t.Fatalf("ScanAuto resolved to %d, want %d", got, want)
	}
}
