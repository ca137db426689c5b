package embedded

import (
	"sync"
	"time"
)

// docCache holds the raw BSON of documents the funnel saw inserted into a
// collection with a change stream open, for the stream's events
// (changestream.go), keyed by database, collection and _id. It keeps at
// most maxCachedDocs documents and maxCachedBytes of them, dropping the
// oldest first: a stream that falls further behind than that (the relay,
// seconds behind a burst of commands, is within it) reads its documents
// back from the store. It is in the store's process, so it is paid for in
// every process that embeds the store (docs/benchmarks.md, BenchmarkRebuild's
// peak RSS).
type docCache struct {
	mu    sync.Mutex
	docs  map[cacheKey]cached
	order []cacheKey // insertion order, oldest first; may hold stale keys
	bytes int
	seq   uint64
}

const (
	maxCachedDocs  = 20_000
	maxCachedBytes = 16 << 20
)

type cacheKey struct {
	db, coll string
	id       idKey
}

type cached struct {
	doc []byte
	at  time.Time // when the funnel saw the insert commit
	seq uint64
}

func (c *docCache) get(db, coll string, id idKey) ([]byte, time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.docs[cacheKey{db, coll, id}]
	return e.doc, e.at, ok
}

func (c *docCache) put(db, coll string, id idKey, doc []byte, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.docs == nil {
		c.docs = map[cacheKey]cached{}
	}
	k := cacheKey{db, coll, id}
	if old, ok := c.docs[k]; ok {
		c.bytes -= len(old.doc)
	}
	c.seq++
	c.docs[k] = cached{doc: doc, at: at, seq: c.seq}
	c.bytes += len(doc)
	c.order = append(c.order, k)
	for (len(c.docs) > maxCachedDocs || c.bytes > maxCachedBytes) && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		if e, ok := c.docs[old]; ok && (old != k || e.seq != c.seq) {
			c.bytes -= len(e.doc)
			delete(c.docs, old)
		}
	}
	if len(c.order) > 2*maxCachedDocs { // stale keys of removed entries
		c.compact()
	}
}

// compact rebuilds order without the keys of entries no longer held;
// under mu.
func (c *docCache) compact() {
	seen := map[cacheKey]bool{}
	out := make([]cacheKey, 0, len(c.docs))
	for i := len(c.order) - 1; i >= 0; i-- {
		k := c.order[i]
		if _, ok := c.docs[k]; ok && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	c.order = out
}

func (c *docCache) remove(db, coll string, id idKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{db, coll, id}
	if e, ok := c.docs[k]; ok {
		c.bytes -= len(e.doc)
		delete(c.docs, k)
	}
}

// dropCollection removes the entries of db.coll, of all of db's
// collections when coll is "" (a dropped collection or database).
func (c *docCache) dropCollection(db, coll string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.docs {
		if k.db == db && (coll == "" || k.coll == coll) {
			c.bytes -= len(e.doc)
			delete(c.docs, k)
		}
	}
}
