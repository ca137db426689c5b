package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/bus"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/eventstore"
)

// databases maps a Store to the database it was built on, for the suite's
// checks on raw documents (a Store does not expose its database).
var databases sync.Map // *eventstore.Store -> *mongo.Database

// Register tells the conformance suite which database s writes to, so it
// can read the raw commit documents. A newStore passed to RunConformance
// must register every Store it returns; the entry is dropped in cleanup.
func Register(t testing.TB, s *eventstore.Store, db *mongo.Database) {
	t.Helper()
	databases.Store(s, db)
	t.Cleanup(func() { databases.Delete(s) })
}

func databaseOf(t testing.TB, s *eventstore.Store) *mongo.Database {
	t.Helper()
	db, ok := databases.Load(s)
	if !ok {
		t.Fatalf("store %p is not registered: newStore must call storetest.Register(t, store, db)", s)
	}
	return db.(*mongo.Database)
}

// NewStream creates a JetStream stream with a unique name on n, deleted in
// cleanup, and returns its configuration. Its subjects are
// "orders.events.<stream id>"; on a shared server (NATS_URL) the prefix gets
// a unique first token so streams of concurrent tests do not overlap.
func NewStream(t testing.TB, n *NATS) bus.StreamConfig {
	t.Helper()
	cfg := bus.StreamConfig{
		Name:          Unique("ORDERS_"),
		SubjectPrefix: "orders.events",
		Replicas:      1,
		Duplicates:    2 * time.Minute,
	}
	if n.Server == nil {
		cfg.SubjectPrefix = Unique("t") + ".orders.events"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStream(ctx, n.JS, cfg); err != nil {
		t.Fatalf("ensure stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.JS.DeleteStream(ctx, cfg.Name)
	})
	return cfg
}

// NewCommit returns a commit of one event per payload for streamID at
// expected version: fresh event ids, versions expected+1.., one causation
// id (the commit's command id) for all of its events, schema version 1 and
// millisecond UTC times (domain.Timestamp), so a loaded event can be
// compared with the appended one field by field.
func NewCommit(streamID string, expected int64, data ...domain.EventData) domain.Commit {
	cmd := Unique("cmd-")
	at := domain.Timestamp(time.Now().Add(-time.Hour))
	c := domain.Commit{StreamID: streamID, StreamType: domain.StreamTypeOrder, ExpectedVersion: expected}
	for i, d := range data {
		c.Events = append(c.Events, domain.Event{
			ID: Unique("evt-") + Unique(""), StreamID: streamID, StreamType: domain.StreamTypeOrder,
			Type: d.EventType(), Version: expected + int64(i) + 1,
			OccurredAt: at.Add(time.Duration(i) * time.Second),
			Data:       d,
			Metadata:   domain.Metadata{CorrelationID: "corr-" + cmd, CausationID: cmd, SchemaVersion: 1},
		})
	}
	return c
}

// placed is a valid OrderPlaced with an amount over 2^31, so a payload
// that loses its int64 on the way through BSON shows.
func placed(customer string) domain.OrderPlaced {
	return domain.OrderPlaced{
		CustomerID: customer, Currency: "BRL", FreightCents: 1590,
		Items: []domain.Line{
			{SKU: "sku-1", Quantity: 2, UnitPriceCents: 4990},
			{SKU: "sku_2", Quantity: 1, UnitPriceCents: 1_000_000_000_000},
		},
	}
}

// RunConformance is the event store conformance suite: the behaviour every
// storage backend of eventstore.Store must show (invariants 1, 2, 7 and 8
// of DESIGN.md §3). newStore returns a Store on an empty database with its
// indexes in place, registered with Register; it is called once per
// subtest. The immutability subtest publishes through a relay, so it also
// needs NATS (StartNATS).
func RunConformance(t *testing.T, newStore func(t *testing.T) *eventstore.Store) {
	t.Run("AppendNewStreamAndLoad", func(t *testing.T) { testAppendAndLoad(t, newStore(t)) })
	t.Run("TimesNormalized", func(t *testing.T) { testTimesNormalized(t, newStore(t)) })
	t.Run("StaleExpectedVersion", func(t *testing.T) { testStaleVersion(t, newStore(t)) })
	t.Run("MultiEventCommit", func(t *testing.T) { testMultiEventCommit(t, newStore(t)) })
	t.Run("UniqueIndexesStartWithStreamID", func(t *testing.T) { testUniqueIndexes(t, newStore(t)) })
	t.Run("IdempotencyKey", func(t *testing.T) { testIdempotencyKey(t, newStore(t)) })
	t.Run("IdempotencyKeyPerStream", func(t *testing.T) { testKeyPerStream(t, newStore(t)) })
	t.Run("CommitsWithoutKeyInOneStream", func(t *testing.T) { testKeylessCommits(t, newStore(t)) })
	t.Run("UnknownIdempotencyKey", func(t *testing.T) { testUnknownKey(t, newStore(t)) })
	t.Run("LoadFrom", func(t *testing.T) { testLoadFrom(t, newStore(t)) })
	t.Run("LoadUnknownStream", func(t *testing.T) { testLoadUnknown(t, newStore(t)) })
	t.Run("InvalidStreamID", func(t *testing.T) { testInvalidStreamID(t, newStore(t)) })
	t.Run("MalformedCommit", func(t *testing.T) { testMalformedCommit(t, newStore(t)) })
	t.Run("UnreadableCommit", func(t *testing.T) { testUnreadableCommit(t, newStore(t)) })
	t.Run("ConcurrentAppendersOneStream", func(t *testing.T) { testConcurrentAppenders(t, newStore(t)) })
	t.Run("RaceSameExpectedVersion", func(t *testing.T) { testRaceSameVersion(t, newStore(t)) })
	t.Run("RaceSameIdempotencyKey", func(t *testing.T) { testRaceSameKey(t, newStore(t)) })
	t.Run("ImmutableAfterPublish", func(t *testing.T) { testImmutable(t, newStore(t)) })
	t.Run("Outbox", func(t *testing.T) { testOutbox(t, newStore(t)) })
	t.Run("ScanInLogOrder", func(t *testing.T) { testScan(t, newStore(t)) })
}

// recorded is what Load should return for c appended at recordedAt.
func recorded(c domain.Commit, recordedAt time.Time) []domain.Event {
	out := make([]domain.Event, len(c.Events))
	for i, e := range c.Events {
		e.OccurredAt = domain.Timestamp(e.OccurredAt)
		e.RecordedAt = recordedAt
		out[i] = e
	}
	return out
}

// DiffEvents describes the first difference between want and got (ids,
// stream, type, version, times with time.Equal and in UTC, data, metadata),
// or returns "" when they are equal.
func DiffEvents(want, got []domain.Event) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d events, want %d: got versions %v", len(got), len(want), versions(got))
	}
	for i := range want {
		w, g := want[i], got[i]
		var d []string
		if w.ID != g.ID {
			d = append(d, fmt.Sprintf("id %q, want %q", g.ID, w.ID))
		}
		if w.StreamID != g.StreamID || w.StreamType != g.StreamType {
			d = append(d, fmt.Sprintf("stream %s/%s, want %s/%s", g.StreamType, g.StreamID, w.StreamType, w.StreamID))
		}
		if w.Type != g.Type {
			d = append(d, fmt.Sprintf("type %s, want %s", g.Type, w.Type))
		}
		if w.Version != g.Version {
			d = append(d, fmt.Sprintf("version %d, want %d", g.Version, w.Version))
		}
		if !w.OccurredAt.Equal(g.OccurredAt) || g.OccurredAt.Location() != time.UTC {
			d = append(d, fmt.Sprintf("occurred_at %v, want %v", g.OccurredAt, w.OccurredAt))
		}
		if !w.RecordedAt.Equal(g.RecordedAt) || g.RecordedAt.Location() != time.UTC {
			d = append(d, fmt.Sprintf("recorded_at %v, want %v", g.RecordedAt, w.RecordedAt))
		}
		if !reflect.DeepEqual(w.Data, g.Data) {
			d = append(d, fmt.Sprintf("data %#v, want %#v", g.Data, w.Data))
		}
		if w.Metadata != g.Metadata {
			d = append(d, fmt.Sprintf("metadata %+v, want %+v", g.Metadata, w.Metadata))
		}
		if len(d) > 0 {
			return fmt.Sprintf("event %d: %s", i, strings.Join(d, "; "))
		}
	}
	return ""
}

func versions(evs []domain.Event) []int64 {
	v := make([]int64, len(evs))
	for i, e := range evs {
		v[i] = e.Version
	}
	return v
}

func mustAppend(t *testing.T, s *eventstore.Store, c domain.Commit) time.Time {
	t.Helper()
	at, err := s.Append(t.Context(), c)
	if err != nil {
		t.Fatalf("append %s at v%d: %v", c.StreamID, c.ExpectedVersion, err)
	}
	return at
}

func mustLoad(t *testing.T, s *eventstore.Store, stream string) []domain.Event {
	t.Helper()
	evs, err := s.Load(t.Context(), stream, 0)
	if err != nil {
		t.Fatalf("load %s: %v", stream, err)
	}
	return evs
}

func wantEvents(t *testing.T, s *eventstore.Store, stream string, want []domain.Event) {
	t.Helper()
	if d := DiffEvents(want, mustLoad(t, s, stream)); d != "" {
		t.Fatalf("load %s: %s", stream, d)
	}
}

// commitCount counts the raw commit documents matching filter.
func commitCount(t *testing.T, s *eventstore.Store, filter bson.D) int64 {
	t.Helper()
	n, err := databaseOf(t, s).Collection(eventstore.CommitsCollection).CountDocuments(t.Context(), filter)
	if err != nil {
		t.Fatalf("count commits: %v", err)
	}
	return n
}

func testAppendAndLoad(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, placed("cust-1"), domain.OrderApproved{})
	before := time.Now()
	at := mustAppend(t, s, c)
	after := time.Now()
	if at != domain.Timestamp(at) {
		t.Errorf("recorded_at %v is not a domain.Timestamp", at)
	}
	if at.Before(domain.Timestamp(before)) || at.After(after) {
		t.Errorf("recorded_at %v is outside the append's [%v, %v]", at, before, after)
	}
	want := recorded(c, at)
	wantEvents(t, s, stream, want)

	c2 := NewCommit(stream, 2, domain.OrderInvoiced{}, domain.OrderShipped{}, domain.OrderCanceled{Reason: "recalled: ü ∑ \"quoted\""})
	at2 := mustAppend(t, s, c2)
	want = append(want, recorded(c2, at2)...)
	wantEvents(t, s, stream, want)
	// Load after a head the caller saw returns only what followed it.
	for _, after := range []int64{0, 2, 5} {
		got, err := s.Load(t.Context(), stream, after)
		if err != nil {
			t.Fatalf("load after v%d: %v", after, err)
		}
		if d := DiffEvents(want[after:], got); d != "" {
			t.Errorf("load after v%d: %s", after, d)
		}
	}
	for i, e := range mustLoad(t, s, stream) {
		if e.Version != int64(i)+1 {
			t.Fatalf("event %d has version %d", i, e.Version)
		}
	}
	if n := commitCount(t, s, bson.D{{Key: "stream_id", Value: stream}}); n != 2 {
		t.Errorf("%d commit documents, want 2", n)
	}
}

func testTimesNormalized(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, domain.OrderApproved{})
	sp := time.FixedZone("BRT", -3*3600)
	raw := time.Date(2018, 3, 4, 5, 6, 7, 891_234_567, sp)
	c.Events[0].OccurredAt = raw
	at := mustAppend(t, s, c)
	evs := mustLoad(t, s, stream)
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	if got, want := evs[0].OccurredAt, domain.Timestamp(raw); !got.Equal(want) || got.Location() != time.UTC || got.Nanosecond() != 891_000_000 {
		t.Errorf("occurred_at %v, want %v (UTC, ms)", got, want)
	}
	if !evs[0].RecordedAt.Equal(at) {
		t.Errorf("recorded_at %v, want %v", evs[0].RecordedAt, at)
	}
}

func testStaleVersion(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	c1 := NewCommit(stream, 0, placed("cust-1"), domain.OrderApproved{})
	c2 := NewCommit(stream, 2, domain.OrderShipped{})
	want := recorded(c1, mustAppend(t, s, c1))
	want = append(want, recorded(c2, mustAppend(t, s, c2))...)

	for _, expected := range []int64{0, 2} {
		c := NewCommit(stream, expected, domain.OrderCanceled{Reason: "stale"}, domain.OrderDelivered{})
		c.IdempotencyKey, c.RequestHash = Unique("key-"), "hash"
		_, err := s.Append(t.Context(), c)
		if !errors.Is(err, domain.ErrVersionConflict) {
			t.Fatalf("append at stale v%d: %v, want ErrVersionConflict", expected, err)
		}
		if _, err := s.FindIdempotencyKey(t.Context(), c.IdempotencyKey, stream); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("key of a refused append: %v, want ErrNotFound", err)
		}
	}
	wantEvents(t, s, stream, want)
	if n := commitCount(t, s, bson.D{{Key: "stream_id", Value: stream}}); n != 2 {
		t.Errorf("%d commit documents, want 2", n)
	}
}

func testMultiEventCommit(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, placed("cust-9"), domain.OrderApproved{}, domain.OrderInvoiced{})
	want := recorded(c, mustAppend(t, s, c))
	wantEvents(t, s, stream, want)

	// One document holds the whole commit: that is what makes it atomic.
	var doc struct {
		FirstVersion int64 `bson:"first_version"`
		LastVersion  int64 `bson:"last_version"`
		Events       []struct {
			ID      string `bson:"event_id"`
			Version int64  `bson:"version"`
		} `bson:"events"`
		Published bool `bson:"published"`
	}
	coll := databaseOf(t, s).Collection(eventstore.CommitsCollection)
	if err := coll.FindOne(t.Context(), bson.D{{Key: "stream_id", Value: stream}}).Decode(&doc); err != nil {
		t.Fatalf("read commit: %v", err)
	}
	if doc.FirstVersion != 1 || doc.LastVersion != 3 || len(doc.Events) != 3 || doc.Published {
		t.Fatalf("commit document: first %d last %d, %d events, published %v; want 1, 3, 3, false",
			doc.FirstVersion, doc.LastVersion, len(doc.Events), doc.Published)
	}
	for i, e := range doc.Events {
		if e.ID != c.Events[i].ID || e.Version != int64(i)+1 {
			t.Errorf("stored event %d: %s v%d, want %s v%d", i, e.ID, e.Version, c.Events[i].ID, i+1)
		}
	}

	// A commit overlapping it, from any version inside it, stores nothing.
	bad := NewCommit(stream, 0, placed("cust-9"))
	if _, err := s.Append(t.Context(), bad); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("append over the commit: %v, want ErrVersionConflict", err)
	}
	wantEvents(t, s, stream, want)
}

func testIdempotencyKey(t *testing.T, s *eventstore.Store) {
	stream, other := Unique("order-"), Unique("order-")
	key := Unique("key-")
	c0 := NewCommit(stream, 0, placed("cust-2"))
	want := recorded(c0, mustAppend(t, s, c0))
	first := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{})
	first.IdempotencyKey, first.RequestHash = key, "sha256:first"
	want = append(want, recorded(first, mustAppend(t, s, first))...)
	mustAppend(t, s, NewCommit(other, 0, placed("cust-3")))

	// The retry of the same request and the same key on the stream's next
	// version: both refused, neither stored.
	retry := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{})
	next := NewCommit(stream, 3, domain.OrderShipped{})
	for name, c := range map[string]domain.Commit{"retry": retry, "next version": next} {
		c.IdempotencyKey, c.RequestHash = key, "sha256:"+name
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrDuplicateRequest) {
			t.Errorf("%s with a used key: %v, want ErrDuplicateRequest", name, err)
		}
		if evs := mustLoad(t, s, c.StreamID); int64(len(evs)) > c.ExpectedVersion && evs[c.ExpectedVersion].ID == c.Events[0].ID {
			t.Errorf("%s with a used key stored its events", name)
		}
	}
	wantEvents(t, s, stream, want)
	if n := commitCount(t, s, bson.D{}); n != 3 {
		t.Errorf("%d commit documents, want 3", n)
	}

	// The key is found in its stream, and only there.
	got, err := s.FindIdempotencyKey(t.Context(), key, stream)
	if err != nil {
		t.Fatalf("find key: %v", err)
	}
	if got.StreamID != stream || got.StreamType != domain.StreamTypeOrder || got.ExpectedVersion != 1 ||
		got.LastVersion() != 3 || got.IdempotencyKey != key || got.RequestHash != "sha256:first" {
		t.Errorf("find key: stream %s/%s v%d..v%d key %q hash %q; want %s/%s v1..v3 key %q hash %q",
			got.StreamType, got.StreamID, got.ExpectedVersion, got.LastVersion(), got.IdempotencyKey, got.RequestHash,
			domain.StreamTypeOrder, stream, key, "sha256:first")
	}
	if d := DiffEvents(want[1:], got.Events); d != "" {
		t.Errorf("find key events: %s", d)
	}
	for _, elsewhere := range []string{"", other, Unique("missing-"), "a.b"} {
		if got, err := s.FindIdempotencyKey(t.Context(), key, elsewhere); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("find key in stream %q: %s, %v; want ErrNotFound", elsewhere, got.StreamID, err)
		}
	}
}

// testUniqueIndexes: a collection sharded by stream_id can only have
// unique indexes that start with the shard key, so every unique index of
// the event collection does; the two that invariants 1 and 7 rely on are
// there.
func testUniqueIndexes(t *testing.T, s *eventstore.Store) {
	coll := databaseOf(t, s).Collection(eventstore.CommitsCollection)
	mustAppend(t, s, NewCommit(Unique("order-"), 0, placed("cust-1")))
	cur, err := coll.Indexes().List(t.Context())
	if err != nil {
		t.Fatalf("list indexes: %v", err)
	}
	var specs []struct {
		Name   string `bson:"name"`
		Key    bson.D `bson:"key"`
		Unique bool   `bson:"unique"`
	}
	if err := cur.All(t.Context(), &specs); err != nil {
		t.Fatalf("read indexes: %v", err)
	}
	var unique []string
	for _, ix := range specs {
		if !ix.Unique || ix.Name == "_id_" {
			continue // _id is exempt from the shard-key rule
		}
		var fields []string
		for _, k := range ix.Key {
			fields = append(fields, k.Key)
		}
		unique = append(unique, strings.Join(fields, ","))
		if fields[0] != "stream_id" {
			t.Errorf("unique index %s on (%s) does not start with stream_id", ix.Name, strings.Join(fields, ", "))
		}
	}
	for _, want := range []string{"stream_id,first_version", "stream_id,idempotency_key"} {
		if !slices.Contains(unique, want) {
			t.Errorf("no unique index on (%s); unique indexes: %q", want, unique)
		}
	}
}

// testKeyPerStream: an idempotency key is unique within its stream, not
// across the log (a collection sharded by stream_id cannot enforce more);
// commits of other streams with the same key, also racing, are stored.
func testKeyPerStream(t *testing.T, s *eventstore.Store) {
	const streams = 8
	key := Unique("key-")
	commits := make([]domain.Commit, streams)
	errs := make([]error, streams)
	for i := range commits {
		commits[i] = NewCommit(Unique("order-"), 0, placed(fmt.Sprintf("cust-%d", i)))
		commits[i].IdempotencyKey, commits[i].RequestHash = key, fmt.Sprintf("hash-%d", i)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range commits {
		wg.Go(func() {
			<-start
			_, errs[i] = s.Append(t.Context(), commits[i])
		})
	}
	close(start)
	wg.Wait()
	for i, c := range commits {
		if errs[i] != nil {
			t.Errorf("stream %d with a key used on other streams: %v, want stored", i, errs[i])
			continue
		}
		got, err := s.FindIdempotencyKey(t.Context(), key, c.StreamID)
		if err != nil || got.StreamID != c.StreamID || got.RequestHash != c.RequestHash {
			t.Errorf("find key in stream %d: %s %q, %v; want %s %q", i, got.StreamID, got.RequestHash, err, c.StreamID, c.RequestHash)
		}
	}
	// Within each stream the key stays taken.
	again := NewCommit(commits[0].StreamID, 1, domain.OrderApproved{})
	again.IdempotencyKey, again.RequestHash = key, "hash-again"
	if _, err := s.Append(t.Context(), again); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Errorf("the key again in its stream: %v, want ErrDuplicateRequest", err)
	}
	if n := commitCount(t, s, bson.D{}); n != streams {
		t.Errorf("%d commit documents, want %d", n, streams)
	}
}

// testKeylessCommits: commits without an idempotency key are never
// compared by the key index, within one stream or across streams.
func testKeylessCommits(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	keyed := NewCommit(stream, 0, placed("cust-1"))
	keyed.IdempotencyKey, keyed.RequestHash = Unique("key-"), "hash"
	mustAppend(t, s, keyed)
	for v := int64(1); v <= 4; v++ {
		mustAppend(t, s, NewCommit(stream, v, domain.OrderApproved{}))
	}
	for i := range 3 {
		mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}))
		mustAppend(t, s, NewCommit(stream, 5+int64(i), domain.OrderApproved{}))
	}
	if evs := mustLoad(t, s, stream); len(evs) != 8 {
		t.Errorf("stream has %d events, want 8", len(evs))
	}
	if n := commitCount(t, s, bson.D{{Key: "stream_id", Value: stream}, {Key: "idempotency_key", Value: bson.D{{Key: "$exists", Value: false}}}}); n != 7 {
		t.Errorf("%d commits of the stream without an idempotency_key field, want 7", n)
	}
}

func testUnknownKey(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	c := NewCommit(stream, 0, domain.OrderApproved{})
	c.IdempotencyKey = Unique("key-")
	mustAppend(t, s, c)
	mustAppend(t, s, NewCommit(stream, 1, domain.OrderShipped{}))
	for _, hint := range []string{"", stream, Unique("missing-")} {
		if _, err := s.FindIdempotencyKey(t.Context(), Unique("key-"), hint); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("find an unknown key (stream %q): %v, want ErrNotFound", hint, err)
		}
	}
	if _, err := s.FindIdempotencyKey(t.Context(), "", ""); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("find the empty key: %v, want ErrNotFound", err)
	}
}

func testLoadFrom(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	var all []domain.Event
	for _, c := range []domain.Commit{
		NewCommit(stream, 0, placed("cust-4"), domain.OrderApproved{}, domain.OrderInvoiced{}),
		NewCommit(stream, 3, domain.OrderProcessingStarted{}),
		NewCommit(stream, 4, domain.OrderShipped{}, domain.OrderDelivered{}),
	} {
		all = append(all, recorded(c, mustAppend(t, s, c))...)
	}
	// Another stream interleaved must not leak in.
	mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}, domain.OrderShipped{}))
	for from := int64(1); from <= 8; from++ {
		got, err := s.LoadFrom(t.Context(), stream, from)
		if err != nil {
			t.Fatalf("load from v%d: %v", from, err)
		}
		want := all[min(from-1, int64(len(all))):]
		if d := DiffEvents(want, got); d != "" {
			t.Errorf("load from v%d: %s", from, d)
		}
	}
}

func testLoadUnknown(t *testing.T, s *eventstore.Store) {
	mustAppend(t, s, NewCommit(Unique("order-"), 0, domain.OrderApproved{}))
	for _, from := range []int64{1, 5} {
		evs, err := s.LoadFrom(t.Context(), Unique("missing-"), from)
		if err != nil || len(evs) != 0 {
			t.Errorf("load unknown stream from v%d: %d events, %v; want none, no error", from, len(evs), err)
		}
	}
	if evs := mustLoad(t, s, Unique("missing-")); len(evs) != 0 {
		t.Errorf("load unknown stream: %d events", len(evs))
	}
}

func testInvalidStreamID(t *testing.T, s *eventstore.Store) {
	for _, id := range []string{"a.b", "$where", strings.Repeat("a", domain.MaxIDLength+1), "", "a b", "orders.>", "a*", "ü"} {
		c := NewCommit(id, 0, domain.OrderApproved{})
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrValidation) {
			t.Errorf("append to stream %q: %v, want ErrValidation", id, err)
		}
	}
	// The longest valid id is accepted.
	ok := strings.Repeat("z", domain.MaxIDLength)
	mustAppend(t, s, NewCommit(ok, 0, domain.OrderApproved{}))
	if n := commitCount(t, s, bson.D{}); n != 1 {
		t.Errorf("%d commit documents, want only the valid one", n)
	}
}

func testMalformedCommit(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	base := NewCommit(stream, 0, placed("cust-5"))
	want := recorded(base, mustAppend(t, s, base))

	mk := func(edit func(c *domain.Commit)) domain.Commit {
		c := NewCommit(stream, 1, domain.OrderApproved{}, domain.OrderInvoiced{}, domain.OrderShipped{})
		edit(&c)
		return c
	}
	cases := map[string]domain.Commit{
		"no events":                mk(func(c *domain.Commit) { c.Events = nil }),
		"negative expected":        mk(func(c *domain.Commit) { c.ExpectedVersion = -1 }),
		"first version skips":      mk(func(c *domain.Commit) { c.ExpectedVersion = 2 }),
		"versions repeat":          mk(func(c *domain.Commit) { c.Events[2].Version = 3 }),
		"versions gap":             mk(func(c *domain.Commit) { c.Events[2].Version = 5 }),
		"versions descend":         mk(func(c *domain.Commit) { c.Events[0].Version, c.Events[1].Version = 3, 2 }),
		"type mismatches data":     mk(func(c *domain.Commit) { c.Events[2].Type = domain.TypeOrderDelivered }),
		"unknown type":             mk(func(c *domain.Commit) { c.Events[1].Type = "OrderTeleported" }),
		"nil data":                 mk(func(c *domain.Commit) { c.Events[0].Data = nil }),
		"event of another stream":  mk(func(c *domain.Commit) { c.Events[1].StreamID = Unique("order-") }),
		"event without id":         mk(func(c *domain.Commit) { c.Events[2].ID = "" }),
		"bad event among good":     mk(func(c *domain.Commit) { c.Events[2].Data = domain.OrderCanceled{} }),
		"bad key on a bad commit":  mk(func(c *domain.Commit) { c.Events = nil; c.IdempotencyKey = "k-bad" }),
		"invalid id with good key": mk(func(c *domain.Commit) { c.StreamID = "a.b"; c.IdempotencyKey = "k-bad2" }),
	}
	for name, c := range cases {
		if _, err := s.Append(t.Context(), c); !errors.Is(err, domain.ErrValidation) {
			t.Errorf("%s: %v, want ErrValidation", name, err)
		}
	}
	wantEvents(t, s, stream, want)
	if n := commitCount(t, s, bson.D{}); n != 1 {
		t.Errorf("%d commit documents after malformed appends, want 1", n)
	}
	for _, key := range []string{"k-bad", "k-bad2"} {
		if _, err := s.FindIdempotencyKey(t.Context(), key, stream); !errors.Is(err, domain.ErrNotFound) {
			t.Errorf("key %s of a refused commit: %v, want ErrNotFound", key, err)
		}
	}
}

// testUnreadableCommit puts in the log, raw, what this build cannot read:
// an event type it does not know (as a newer writer stores it), a commit
// that does not continue its stream's versions, and a document that is
// not a commit. Reading those streams fails with ErrUnreadableCommit, not
// ErrUnavailable (readers would retry it for ever); a scan hands each of
// them over with that error and the events before it, and goes on.
func testUnreadableCommit(t *testing.T, s *eventstore.Store) {
	ctx := t.Context()
	commits := databaseOf(t, s).Collection(eventstore.CommitsCollection)
	at := time.Date(2025, 2, 3, 4, 5, 6, 0, time.UTC)
	// raw is a commit document stored under id, as another writer stores it.
	raw := func(id, stream string, first, last int64, events any) bson.D {
		return bson.D{{Key: "_id", Value: id}, {Key: "stream_id", Value: stream},
			{Key: "stream_type", Value: domain.StreamTypeOrder}, {Key: "first_version", Value: first}, {Key: "last_version", Value: last},
			{Key: "events", Value: events}, {Key: "recorded_at", Value: at}, {Key: "published", Value: true}}
	}
	newer, chain, garbled, fine := Unique("newer-"), Unique("chain-"), Unique("garbled-"), Unique("fine-")
	var heads []domain.Event
	for _, stream := range []string{newer, chain, garbled, fine} {
		c := NewCommit(stream, 0, placed("cust-u"))
		heads = append(heads, recorded(c, mustAppend(t, s, c))...)
	}
	for _, d := range []bson.D{
		raw(eventstore.CommitID(newer, 2), newer, 2, 2, bson.A{bson.D{{Key: "event_id", Value: "e-refund"}, {Key: "type", Value: "OrderRefunded"},
			{Key: "version", Value: int64(2)}, {Key: "occurred_at", Value: at}, {Key: "recorded_at", Value: at},
			{Key: "data", Value: bson.D{{Key: "amount_cents", Value: int64(100)}}}, {Key: "schema_version", Value: 1}}}),
		// Where the commit starting at v2 belongs, one holding v3.
		raw(eventstore.CommitID(chain, 2), chain, 3, 3, bson.A{}),
		raw(eventstore.CommitID(garbled, 2), garbled, 2, 2, "not a list of events"),
	} {
		if _, err := commits.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, stream := range []string{newer, chain, garbled} {
		for _, from := range []int64{1, 2} {
			_, err := s.LoadFrom(ctx, stream, from)
			if !errors.Is(err, domain.ErrUnreadableCommit) || errors.Is(err, domain.ErrUnavailable) {
				t.Errorf("load %s from v%d: %v, want ErrUnreadableCommit", stream, from, err)
			}
		}
	}
	if _, err := s.Load(ctx, newer, 0); !errors.Is(err, domain.ErrUnknownEvent) {
		t.Errorf("load %s: %v, want it to wrap ErrUnknownEvent too", newer, err)
	}
	got := map[string]domain.StreamEvents{}
	if err := s.Scan(ctx, eventstore.ScanRange{}, func(st domain.StreamEvents) error {
		got[st.StreamID] = st
		return nil
	}); err != nil {
		t.Fatalf("scan over unreadable commits: %v", err)
	}
	for i, stream := range []string{newer, chain, garbled, fine} {
		st := got[stream]
		if d := DiffEvents(heads[i:i+1], st.Events); d != "" {
			t.Errorf("scan %s: %s", stream, d)
		}
		// A scan reads commits by id, not along the chain: the stray
		// commit holds no event to decode.
		if unreadable := stream == newer || stream == garbled; unreadable != errors.Is(st.Err, domain.ErrUnreadableCommit) {
			t.Errorf("scan %s: error %v", stream, st.Err)
		}
	}
}

// attempt is one append of the concurrency tests.
type attempt struct {
	c   domain.Commit
	err error
}

func testConcurrentAppenders(t *testing.T, s *eventstore.Store) {
	// The writers stop when the stream reaches targetEvents, after
	// maxAttempts appends in all, or after budget. On the embedded FerretDB
	// under the race detector 64 concurrent loads of a growing stream take
	// seconds each, so there the budget is what ends the run (some 40
	// commits, each won against up to 63 rivals). An append is never cut
	// short: its outcome must be known for the checks below.
	const (
		writers      = 64
		targetEvents = 200
		maxAttempts  = 2000
		budget       = 15 * time.Second
	)
	ctx := t.Context()
	deadline := time.Now().Add(budget)
	loadCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stream := Unique("order-")
	var (
		tries atomic.Int64
		head  atomic.Int64 // highest version a successful append reached
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	results := make([][]attempt, writers)
	failures := make([]error, writers) // an error other than a conflict ends a writer
	for g := range writers {
		wg.Go(func() {
			<-start
			// known is the head this writer last loaded or wrote. After a
			// conflict it loads the events after it, like a cached state
			// catching up, and appends at the new head.
			known, stale := int64(0), true
			conflicts := 0 // in a row, for the backoff
			for head.Load() < targetEvents && loadCtx.Err() == nil && tries.Add(1) <= maxAttempts {
				if stale {
					// A jittered backoff after a conflict, as the command
					// service does, so the losers do not all reload at once.
					time.Sleep(time.Duration(rand.Int64N(int64(min(time.Millisecond<<conflicts, 100*time.Millisecond)) + 1)))
					evs, err := s.Load(loadCtx, stream, known)
					if loadCtx.Err() != nil || (err != nil && (!time.Now().Before(deadline) || errors.Is(err, context.DeadlineExceeded))) {
						// Out of time: a load may be cut short (the driver
						// refuses one whose remaining time is below its
						// round-trip estimate), an append never is.
						return
					}
					if err != nil {
						failures[g] = fmt.Errorf("load after v%d: %w", known, err)
						return
					}
					for i, e := range evs {
						if e.Version != known+int64(i)+1 {
							failures[g] = fmt.Errorf("load after v%d: event %d is v%d", known, i, e.Version)
							return
						}
					}
					known, stale = known+int64(len(evs)), false
				}
				data := []domain.EventData{domain.OrderCanceled{Reason: fmt.Sprintf("writer %d try %d", g, len(results[g]))}}
				for range (g + len(results[g])) % 3 {
					data = append(data, domain.OrderApproved{})
				}
				c := NewCommit(stream, known, data...)
				_, err := s.Append(ctx, c)
				results[g] = append(results[g], attempt{c, err})
				if err != nil {
					stale, conflicts = true, min(conflicts+1, 7)
					continue
				}
				known, conflicts = c.LastVersion(), 0
				for h := head.Load(); h < known && !head.CompareAndSwap(h, known); h = head.Load() {
				}
			}
		})
	}
	close(start)
	wg.Wait()

	for g, err := range failures {
		if err != nil {
			t.Errorf("writer %d: %v", g, err)
		}
	}
	var wins []domain.Commit
	conflicts := 0
	failed := map[string]bool{} // causation ids of refused commits
	for _, rs := range results {
		for _, a := range rs {
			switch {
			case a.err == nil:
				wins = append(wins, a.c)
			case errors.Is(a.err, domain.ErrVersionConflict):
				conflicts++
				failed[a.c.Events[0].Metadata.CausationID] = true
			default:
				t.Errorf("append %s at v%d: %v, want success or ErrVersionConflict", a.c.StreamID, a.c.ExpectedVersion, a.err)
			}
		}
	}
	t.Logf("%d appends: %d committed, %d conflicts; head v%d", len(wins)+conflicts, len(wins), conflicts, head.Load())
	if len(wins) < 2 {
		t.Fatalf("%d appends succeeded; the test needs progress", len(wins))
	}

	evs := mustLoad(t, s, stream)
	seen := make(map[int64]int, len(evs))
	byID := make(map[string]domain.Event, len(evs))
	commits := map[string]bool{}
	for _, e := range evs {
		seen[e.Version]++
		byID[e.ID] = e
		commits[e.Metadata.CausationID] = true
		if failed[e.Metadata.CausationID] {
			t.Errorf("v%d (%s) belongs to a refused append", e.Version, e.ID)
		}
	}
	n := head.Load()
	if int64(len(evs)) != n {
		t.Errorf("stream holds %d events, the highest committed version is %d", len(evs), n)
	}
	for v := int64(1); v <= n; v++ {
		if seen[v] != 1 {
			t.Errorf("version %d appears %d times", v, seen[v])
		}
	}
	total := 0
	for _, c := range wins {
		total += len(c.Events)
		for _, e := range c.Events {
			got, ok := byID[e.ID]
			if !ok {
				t.Errorf("event %s of a successful append (v%d) is missing", e.ID, e.Version)
				continue
			}
			if got.Version != e.Version || got.Type != e.Type || !reflect.DeepEqual(got.Data, e.Data) {
				t.Errorf("event %s: stored as %s v%d %+v, appended as %s v%d %+v", e.ID, got.Type, got.Version, got.Data, e.Type, e.Version, e.Data)
			}
		}
	}
	if total != len(evs) {
		t.Errorf("successful appends wrote %d events, the stream holds %d", total, len(evs))
	}
	if len(commits) != len(wins) {
		t.Errorf("the log holds %d commits, %d appends succeeded", len(commits), len(wins))
	}
	if docs := commitCount(t, s, bson.D{{Key: "stream_id", Value: stream}}); docs != int64(len(wins)) {
		t.Errorf("%d commit documents, %d appends succeeded", docs, len(wins))
	}
}

func testRaceSameVersion(t *testing.T, s *eventstore.Store) {
	stream := Unique("order-")
	var want []domain.Event
	want = raceAt(t, s, stream, want) // a new stream: everyone expects v0
	c := NewCommit(stream, int64(len(want)), domain.OrderInvoiced{}, domain.OrderApproved{})
	want = append(want, recorded(c, mustAppend(t, s, c))...)
	raceAt(t, s, stream, want) // a stream with a head
	if n := commitCount(t, s, bson.D{{Key: "stream_id", Value: stream}}); n != 3 {
		t.Errorf("%d commit documents, want 3", n)
	}
}

// raceAt lets 64 goroutines append to stream at the head of want at once:
// exactly one may win. It returns want with the winner's events.
func raceAt(t *testing.T, s *eventstore.Store, stream string, want []domain.Event) []domain.Event {
	t.Helper()
	const racers = 64
	expected := int64(len(want))
	commits := make([]domain.Commit, racers)
	errs := make([]error, racers)
	ats := make([]time.Time, racers)
	for i := range commits {
		data := []domain.EventData{domain.OrderCanceled{Reason: fmt.Sprintf("racer %d", i)}}
		if i%2 == 1 {
			data = append(data, domain.OrderShipped{})
		}
		commits[i] = NewCommit(stream, expected, data...)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			ats[i], errs[i] = s.Append(t.Context(), commits[i])
		})
	}
	close(start)
	wg.Wait()
	winner, conflicts := -1, 0
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("at v%d racers %d and %d both won", expected, winner, i)
		case err == nil:
			winner = i
		case errors.Is(err, domain.ErrVersionConflict):
			conflicts++
		default:
			t.Errorf("at v%d racer %d: %v, want ErrVersionConflict", expected, i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("at v%d no racer won", expected)
	}
	if conflicts != racers-1 {
		t.Errorf("at v%d: %d conflicts, want %d", expected, conflicts, racers-1)
	}
	want = append(want, recorded(commits[winner], ats[winner])...)
	wantEvents(t, s, stream, want)
	return want
}

// testRaceSameKey: racing retries of one request (one stream, one
// version, one key): one is stored, every other one is told the key is
// stored, not that the version moved on.
func testRaceSameKey(t *testing.T, s *eventstore.Store) {
	const racers = 16
	key, stream := Unique("key-"), Unique("order-")
	commits := make([]domain.Commit, racers)
	errs := make([]error, racers)
	for i := range commits {
		commits[i] = NewCommit(stream, 0, placed(fmt.Sprintf("cust-%d", i)))
		commits[i].IdempotencyKey, commits[i].RequestHash = key, fmt.Sprintf("hash-%d", i)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			_, errs[i] = s.Append(t.Context(), commits[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("racers %d and %d both stored key %s", winner, i, key)
		case err == nil:
			winner = i
		case !errors.Is(err, domain.ErrDuplicateRequest):
			t.Errorf("racer %d: %v, want ErrDuplicateRequest", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no racer stored the key")
	}
	got, err := s.FindIdempotencyKey(t.Context(), key, stream)
	if err != nil || got.StreamID != commits[winner].StreamID || got.RequestHash != commits[winner].RequestHash {
		t.Errorf("find key: %s %q, %v; want the winner's %s %q", got.StreamID, got.RequestHash, err,
			commits[winner].StreamID, commits[winner].RequestHash)
	}
	if n := commitCount(t, s, bson.D{}); n != 1 {
		t.Errorf("%d commit documents, want 1", n)
	}
}

// rawCommits returns the stream's raw commit documents in version order.
func rawCommits(t *testing.T, coll *mongo.Collection, stream string) []bson.Raw {
	t.Helper()
	cur, err := coll.Find(t.Context(), bson.D{{Key: "stream_id", Value: stream}},
		options.Find().SetSort(bson.D{{Key: "first_version", Value: 1}}))
	if err != nil {
		t.Fatalf("read raw commits: %v", err)
	}
	var docs []bson.Raw
	if err := cur.All(t.Context(), &docs); err != nil {
		t.Fatalf("read raw commits: %v", err)
	}
	return docs
}

// immutablePart returns the elements of a commit document other than the
// outbox marker, in stored order.
func immutablePart(t *testing.T, doc bson.Raw) []bson.RawElement {
	t.Helper()
	els, err := doc.Elements()
	if err != nil {
		t.Fatalf("raw commit: %v", err)
	}
	var out []bson.RawElement
	for _, e := range els {
		if k := e.Key(); k != "published" && k != "published_at" {
			out = append(out, e)
		}
	}
	return out
}

func testImmutable(t *testing.T, s *eventstore.Store) {
	ctx := t.Context()
	coll := databaseOf(t, s).Collection(eventstore.CommitsCollection)
	stream := Unique("order-")
	c1 := NewCommit(stream, 0, placed("cust-7"), domain.OrderApproved{})
	c1.IdempotencyKey, c1.RequestHash = Unique("key-"), "hash-1"
	mustAppend(t, s, c1)
	mustAppend(t, s, NewCommit(stream, 2, domain.OrderShipped{}, domain.OrderCanceled{Reason: "recalled"}))
	before := rawCommits(t, coll, stream)
	if len(before) != 2 {
		t.Fatalf("%d raw commits, want 2", len(before))
	}
	for i, d := range before {
		if pub, ok := d.Lookup("published").BooleanOK(); !ok || pub {
			t.Fatalf("commit %d: published = %v before the relay ran", i, d.Lookup("published"))
		}
		if _, err := d.LookupErr("published_at"); err == nil {
			t.Fatalf("commit %d has published_at before the relay ran", i)
		}
	}

	// Refused appends, a later commit and the relay's marking must leave
	// the stored commits as they were.
	if _, err := s.Append(ctx, NewCommit(stream, 2, domain.OrderDelivered{})); !errors.Is(err, domain.ErrVersionConflict) {
		t.Fatalf("stale append: %v", err)
	}
	dup := NewCommit(stream, 4, domain.OrderDelivered{})
	dup.IdempotencyKey = c1.IdempotencyKey
	if _, err := s.Append(ctx, dup); !errors.Is(err, domain.ErrDuplicateRequest) {
		t.Fatalf("duplicate key: %v", err)
	}
	mustAppend(t, s, NewCommit(stream, 4, domain.OrderDelivered{}))

	markedFrom := domain.Timestamp(time.Now())
	for i := 0; ; i++ {
		pending, err := s.Pending(ctx, time.Time{}, 1000)
		if err != nil {
			t.Fatalf("read outbox: %v", err)
		}
		var ids []string
		for _, c := range pending {
			if c.StreamID == stream {
				ids = append(ids, c.ID)
			}
		}
		if len(ids) == 0 {
			break
		}
		if i == 10 {
			t.Fatal("the outbox still holds the stream's commits after 10 rounds of markers")
		}
		if n, err := s.MarkPublished(ctx, ids); err != nil || n != len(ids) {
			t.Fatalf("mark %d commits published: %d marked, %v", len(ids), n, err)
		}
	}
	after := rawCommits(t, coll, stream)
	if len(after) != 3 {
		t.Fatalf("%d raw commits after publishing, want 3", len(after))
	}
	for i, d := range after {
		if pub, ok := d.Lookup("published").BooleanOK(); !ok || !pub {
			t.Errorf("commit %d: published = %v after the relay ran", i, d.Lookup("published"))
		}
		at, ok := d.Lookup("published_at").TimeOK()
		if !ok || at.Before(markedFrom) || at.After(time.Now()) {
			t.Errorf("commit %d: published_at = %v, want a date in the relay's run", i, d.Lookup("published_at"))
		}
	}
	for i, d := range before {
		was, is := immutablePart(t, d), immutablePart(t, after[i])
		if len(was) != len(is) {
			t.Errorf("commit %d: %d fields besides the marker, had %d:\nwas %s\nis  %s", i, len(is), len(was), d, after[i])
			continue
		}
		for j := range was {
			if !bytes.Equal(was[j], is[j]) {
				t.Errorf("commit %d field %q changed:\nwas %s\nis  %s", i, was[j].Key(), was[j].Value(), is[j].Value())
			}
		}
	}
}
