package storetest

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// store is a Store under test and the database it writes to, for the
// suite's checks on raw documents (a Store does not expose its database).
type store struct {
	*mongodb.EventStore
	db *mongo.Database
}

// NewStore returns a Store on an empty database with its indexes in place
// (OpenStore, say), and that database.
type NewStore func(t *testing.T) (*mongodb.EventStore, *mongo.Database)

// run runs test as the subtest name on a store of newStore.
func run(t *testing.T, name string, newStore NewStore, test func(*testing.T, store)) {
	t.Run(name, func(t *testing.T) {
		s, db := newStore(t)
		test(t, store{s, db})
	})
}

// RunScan is the part of the conformance suite that reads the log in log
// order (Scan and Bounds), and reads unreadable commits, for running it
// with passes of a few ids too; RunConformance runs it.
func RunScan(t *testing.T, newStore NewStore) {
	run(t, "ScanInLogOrder", newStore, testScan)
	run(t, "UnreadableCommit", newStore, testUnreadableCommit)
	run(t, "BoundsBalanced", newStore, testBoundsBalanced)
}

// RunConformance is the event store conformance suite: the behaviour every
// storage backend of mongodb.EventStore must show (invariants 1, 2, 7 and 8
// of docs/guarantees.md). newStore is called once per subtest.
func RunConformance(t *testing.T, newStore NewStore) {
	RunReadPaths(t, newStore)
	run(t, "TimesNormalized", newStore, testTimesNormalized)
	run(t, "StaleExpectedVersion", newStore, testStaleVersion)
	run(t, "UniqueIndexesStartWithStreamID", newStore, testUniqueIndexes)
	run(t, "InvalidStreamID", newStore, testInvalidStreamID)
	run(t, "MalformedCommit", newStore, testMalformedCommit)
	run(t, "ConcurrentAppendersOneStream", newStore, testConcurrentAppenders)
	run(t, "RaceSameExpectedVersion", newStore, testRaceSameVersion)
	run(t, "RaceSameIdempotencyKey", newStore, testRaceSameKey)
	run(t, "GroupCommitManyStreams", newStore, testGroupManyStreams)
	run(t, "GroupCommitMixedOutcomes", newStore, testGroupMixedOutcomes)
	run(t, "CommitsNeverChange", newStore, testImmutable)
	run(t, "RecordedSince", newStore, testRecordedSince)
	run(t, "OldestUnpublished", newStore, testOldestUnpublished)
}

// RunReadPaths is the part of the suite whose outcome depends on the
// store's access paths (the Dialect): loading streams, finding
// idempotency keys, scanning the log. The rest writes through the one
// path every dialect shares. It is what runs on the side of the seam that
// is not the store's own (MongoDB's paths on the embedded store, where
// they are correct but scan every collection).
func RunReadPaths(t *testing.T, newStore NewStore) {
	run(t, "AppendNewStreamAndLoad", newStore, testAppendAndLoad)
	run(t, "MultiEventCommit", newStore, testMultiEventCommit)
	run(t, "IdempotencyKey", newStore, testIdempotencyKey)
	run(t, "IdempotencyKeyPerStream", newStore, testKeyPerStream)
	run(t, "CommitsWithoutKeyInOneStream", newStore, testKeylessCommits)
	run(t, "UnknownIdempotencyKey", newStore, testUnknownKey)
	run(t, "LoadFrom", newStore, testLoadFrom)
	run(t, "LoadUnknownStream", newStore, testLoadUnknown)
	run(t, "Browse", newStore, testBrowse)
	RunScan(t, newStore)
}

func mustAppend(t *testing.T, s store, c domain.Commit) time.Time {
	t.Helper()
	at, err := s.Append(t.Context(), c)
	if err != nil {
		t.Fatalf("append %s at v%d: %v", c.StreamID, c.ExpectedVersion, err)
	}
	return at
}

// appendRecorded appends c and returns its events as Load returns them.
func appendRecorded(t *testing.T, s store, c domain.Commit) []domain.Event {
	t.Helper()
	return recorded(c, mustAppend(t, s, c))
}

func mustLoad(t *testing.T, s store, stream string) []domain.Event {
	t.Helper()
	evs, err := s.Load(t.Context(), stream, 0)
	if err != nil {
		t.Fatalf("load %s: %v", stream, err)
	}
	return evs
}

func wantEvents(t *testing.T, s store, stream string, want []domain.Event) {
	t.Helper()
	if d := DiffEvents(want, mustLoad(t, s, stream)); d != "" {
		t.Fatalf("load %s: %s", stream, d)
	}
}

// wantCommits checks that filter matches want raw commit documents.
func wantCommits(t *testing.T, s store, filter bson.D, want int64) {
	t.Helper()
	n, err := s.db.Collection(mongodb.CommitsCollection).CountDocuments(t.Context(), filter)
	if err != nil {
		t.Fatalf("count commits: %v", err)
	}
	if n != want {
		t.Errorf("%d commit documents matching %v, want %d", n, filter, want)
	}
}

// inStream matches the raw commit documents of stream.
func inStream(stream string) bson.D { return bson.D{{Key: "stream_id", Value: stream}} }
