package embedded

import "sync"

// docCache holds the raw BSON of documents the funnel saw inserted into a
// log (LogCollection), by the rowid each took, so that the relay's stream
// does not read each commit back from FerretDB: with it the
// read models became visible after a command in half the time
// (docs/embedded-store.md, "Why the change streams cache documents"). The
// oldest go first beyond maxCachedDocs or maxCachedBytes. It keeps each
// log's largest rowid too, where it knows it (insertCommitted).
type docCache struct {
	mu    sync.Mutex
	docs  map[cacheKey][]byte
	order []cacheKey // insertion order, oldest first; may hold removed keys
	bytes int
	ends  map[[2]string]int64 // {db, coll} → the largest rowid
}

const (
	maxCachedDocs  = 20_000
	maxCachedBytes = 16 << 20
)

type cacheKey struct {
	db, coll string
	rowid    int64
}

func (c *docCache) get(db, coll string, rowid int64) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	doc, ok := c.docs[cacheKey{db, coll, rowid}]
	return doc, ok
}

func (c *docCache) put(db, coll string, rowid int64, doc []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.docs == nil {
		c.docs = map[cacheKey][]byte{}
	}
	k := cacheKey{db, coll, rowid}
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

// end returns the largest rowid of db.coll, when known.
func (c *docCache) end(db, coll string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end, ok := c.ends[[2]string{db, coll}]
	return end, ok
}

// setEnd records the largest rowid of db.coll; known false forgets it (a
// write that may have added rows the funnel did not count).
func (c *docCache) setEnd(db, coll string, end int64, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ends == nil {
		c.ends = map[[2]string]int64{}
	}
	if known {
		c.ends[[2]string{db, coll}] = end
	} else {
		delete(c.ends, [2]string{db, coll})
	}
}

// dropCollection removes the entries of db.coll, of all of db's
// collections when coll is "" (a dropped collection or database, or one
// whose rows a delete may have freed for a later insert), and their ends.
func (c *docCache) dropCollection(db, coll string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.ends {
		if k[0] == db && (coll == "" || k[1] == coll) {
			delete(c.ends, k)
		}
	}
	for k, doc := range c.docs {
		if k.db == db && (coll == "" || k.coll == coll) {
			c.bytes -= len(doc)
			delete(c.docs, k)
		}
	}
}
