package storetest

import (
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// databases maps a Store to the database it was built on, for the suite's
// checks on raw documents (a Store does not expose its database).
var databases sync.Map // *mongodb.EventStore -> *mongo.Database

// Register tells the conformance suite which database s writes to, so it
// can read the raw commit documents. A newStore passed to RunConformance
// must register every Store it returns; the entry is dropped in cleanup.
func Register(t testing.TB, s *mongodb.EventStore, db *mongo.Database) {
	t.Helper()
	databases.Store(s, db)
	t.Cleanup(func() { databases.Delete(s) })
}

func databaseOf(t testing.TB, s *mongodb.EventStore) *mongo.Database {
	t.Helper()
	db, ok := databases.Load(s)
	if !ok {
		t.Fatalf("store %p is not registered: newStore must call storetest.Register(t, store, db)", s)
	}
	return db.(*mongo.Database)
}

// RunScan is the part of the conformance suite that reads the log in log
// order (Scan and Bounds), and reads unreadable commits, for running it
// with passes of a few ids too; RunConformance runs it.
func RunScan(t *testing.T, newStore func(t *testing.T) *mongodb.EventStore) {
	t.Run("ScanInLogOrder", func(t *testing.T) { testScan(t, newStore(t)) })
	t.Run("UnreadableCommit", func(t *testing.T) { testUnreadableCommit(t, newStore(t)) })
	t.Run("BoundsBalanced", func(t *testing.T) { testBoundsBalanced(t, newStore(t)) })
}

// RunConformance is the event store conformance suite: the behaviour every
// storage backend of mongodb.EventStore must show (invariants 1, 2, 7 and 8
// of docs/guarantees.md). newStore returns a Store on an empty database with its
// indexes in place, registered with Register; it is called once per
// subtest.
func RunConformance(t *testing.T, newStore func(t *testing.T) *mongodb.EventStore) {
	RunReadPaths(t, newStore)
	t.Run("TimesNormalized", func(t *testing.T) { testTimesNormalized(t, newStore(t)) })
	t.Run("StaleExpectedVersion", func(t *testing.T) { testStaleVersion(t, newStore(t)) })
	t.Run("UniqueIndexesStartWithStreamID", func(t *testing.T) { testUniqueIndexes(t, newStore(t)) })
	t.Run("InvalidStreamID", func(t *testing.T) { testInvalidStreamID(t, newStore(t)) })
	t.Run("MalformedCommit", func(t *testing.T) { testMalformedCommit(t, newStore(t)) })
	t.Run("ConcurrentAppendersOneStream", func(t *testing.T) { testConcurrentAppenders(t, newStore(t)) })
	t.Run("RaceSameExpectedVersion", func(t *testing.T) { testRaceSameVersion(t, newStore(t)) })
	t.Run("RaceSameIdempotencyKey", func(t *testing.T) { testRaceSameKey(t, newStore(t)) })
	t.Run("GroupCommitManyStreams", func(t *testing.T) { testGroupManyStreams(t, newStore(t)) })
	t.Run("GroupCommitMixedOutcomes", func(t *testing.T) { testGroupMixedOutcomes(t, newStore(t)) })
	t.Run("CommitsNeverChange", func(t *testing.T) { testImmutable(t, newStore(t)) })
	t.Run("RecordedSince", func(t *testing.T) { testRecordedSince(t, newStore(t)) })
	t.Run("OldestUnpublished", func(t *testing.T) { testOldestUnpublished(t, newStore(t)) })
}

// RunReadPaths is the part of the suite whose outcome depends on the
// store's access paths (the Dialect): loading streams, finding
// idempotency keys, scanning the log. The rest writes through the one
// path every dialect shares. It is what runs on the side of the seam that
// is not the store's own (MongoDB's paths on the embedded store, where
// they are correct but scan every collection).
func RunReadPaths(t *testing.T, newStore func(t *testing.T) *mongodb.EventStore) {
	t.Run("AppendNewStreamAndLoad", func(t *testing.T) { testAppendAndLoad(t, newStore(t)) })
	t.Run("MultiEventCommit", func(t *testing.T) { testMultiEventCommit(t, newStore(t)) })
	t.Run("IdempotencyKey", func(t *testing.T) { testIdempotencyKey(t, newStore(t)) })
	t.Run("IdempotencyKeyPerStream", func(t *testing.T) { testKeyPerStream(t, newStore(t)) })
	t.Run("CommitsWithoutKeyInOneStream", func(t *testing.T) { testKeylessCommits(t, newStore(t)) })
	t.Run("UnknownIdempotencyKey", func(t *testing.T) { testUnknownKey(t, newStore(t)) })
	t.Run("LoadFrom", func(t *testing.T) { testLoadFrom(t, newStore(t)) })
	t.Run("LoadUnknownStream", func(t *testing.T) { testLoadUnknown(t, newStore(t)) })
	t.Run("Browse", func(t *testing.T) { testBrowse(t, newStore(t)) })
	RunScan(t, newStore)
}

func mustAppend(t *testing.T, s *mongodb.EventStore, c domain.Commit) time.Time {
	t.Helper()
	at, err := s.Append(t.Context(), c)
	if err != nil {
		t.Fatalf("append %s at v%d: %v", c.StreamID, c.ExpectedVersion, err)
	}
	return at
}

// appendRecorded appends c and returns its events as Load returns them.
func appendRecorded(t *testing.T, s *mongodb.EventStore, c domain.Commit) []domain.Event {
	t.Helper()
	return recorded(c, mustAppend(t, s, c))
}

func mustLoad(t *testing.T, s *mongodb.EventStore, stream string) []domain.Event {
	t.Helper()
	evs, err := s.Load(t.Context(), stream, 0)
	if err != nil {
		t.Fatalf("load %s: %v", stream, err)
	}
	return evs
}

func wantEvents(t *testing.T, s *mongodb.EventStore, stream string, want []domain.Event) {
	t.Helper()
	if d := DiffEvents(want, mustLoad(t, s, stream)); d != "" {
		t.Fatalf("load %s: %s", stream, d)
	}
}

// commitCount counts the raw commit documents matching filter.
func commitCount(t *testing.T, s *mongodb.EventStore, filter bson.D) int64 {
	t.Helper()
	n, err := databaseOf(t, s).Collection(mongodb.CommitsCollection).CountDocuments(t.Context(), filter)
	if err != nil {
		t.Fatalf("count commits: %v", err)
	}
	return n
}

// wantCommits checks that filter matches want raw commit documents.
func wantCommits(t *testing.T, s *mongodb.EventStore, filter bson.D, want int64) {
	t.Helper()
	if n := commitCount(t, s, filter); n != want {
		t.Errorf("%d commit documents, want %d", n, want)
	}
}

// inStream matches the raw commit documents of stream.
func inStream(stream string) bson.D { return bson.D{{Key: "stream_id", Value: stream}} }
