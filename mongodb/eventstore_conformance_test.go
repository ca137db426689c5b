package mongodb_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"

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
			run(t, func(t *testing.T) (*mongodb.EventStore, *mongo.Database) {
				s, db := storetest.OpenStore(t)
				mongodb.UseDialect(db.Client(), d)
				return s, db
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
	rounds := 250
	if *chaosLong {
		rounds = 0 // the suite's default
	}
	storetest.RunAtomicity(t, rounds)
}

// TestScanInPasses runs the scan part of the suite on the embedded
// store's path, which reads the range's commit ids first, in passes of a
// few ids (TestConformance runs it with the budget of a pass, on both
// sides of the dialect seam).
func TestScanInPasses(t *testing.T) {
	// Passes of 1 to 3 ids: a stream of two commits straddles every cut
	// of 1 and most cuts of 3.
	for _, budget := range []int{1, 3} {
		t.Run(fmt.Sprintf("passes-of-%d", budget), func(t *testing.T) {
			storetest.RunScan(t, func(t *testing.T) (*mongodb.EventStore, *mongo.Database) {
				s, db := storetest.OpenStore(t, mongodb.WithIDBudget(budget))
				mongodb.UseDialect(db.Client(), mongodb.DialectFerretDB)
				return s, db
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
