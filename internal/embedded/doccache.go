package embedded

import "sync"

// docCache holds the raw BSON of documents the funnel saw inserted into a
// collection a change stream has read, for the stream's events
// (changestream.go), keyed by database, collection and _id, so that the
// relay's stream does not read each commit back from FerretDB: with it
// the read models became visible after a command in half the time
// (docs/embedded-store.md, "Why the change streams cache documents"). It
// keeps at most maxCachedDocs documents and maxCachedBytes of them, the
// oldest going first: a stream further behind reads its documents back.
type docCache struct {
	mu    sync.Mutex
	docs  map[cacheKey][]byte
	order []cacheKey // insertion order, oldest first; may hold removed keys
	bytes int
}

const (
	maxCachedDocs  = 20_000
	maxCachedBytes = 16 << 20
)

type cacheKey struct{ db, coll, id string }

func (c *docCache) get(db, coll, id string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	doc, ok := c.docs[cacheKey{db, coll, id}]
	return doc, ok
}

func (c *docCache) put(db, coll, id string, doc []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.docs == nil {
		c.docs = map[cacheKey][]byte{}
	}
	k := cacheKey{db, coll, id}
	c.bytes += len(doc) - len(c.docs[k])
	c.docs[k] = doc
	c.order = append(c.order, k)
	for len(c.order) > 0 && (len(c.docs) > maxCachedDocs || c.bytes > maxCachedBytes || len(c.order) > 2*maxCachedDocs) {
		old := c.order[0]
		c.order = c.order[1:]
		if old != k { // k's later entry in order is the one that counts
			c.bytes -= len(c.docs[old])
			delete(c.docs, old)
		}
	}
}

func (c *docCache) remove(db, coll, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{db, coll, id}
	c.bytes -= len(c.docs[k])
	delete(c.docs, k)
}

// dropCollection removes the entries of db.coll, of all of db's
// collections when coll is "" (a dropped collection or database).
func (c *docCache) dropCollection(db, coll string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, doc := range c.docs {
		if k.db == db && (coll == "" || k.coll == coll) {
			c.bytes -= len(doc)
			delete(c.docs, k)
		}
	}
}
