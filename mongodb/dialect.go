package mongodb

import (
	"context"
	"fmt"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Dialect is the one seam between MongoDB and the embedded store
// (FerretDB 1.24 on SQLite): the access paths the store answering a client
// serves at index speed. Every adapter takes MongoDB's paths unless the
// dialect says otherwise, and each such branch names its measured reason.
type Dialect int

const (
	// MongoDB serves ranged queries, $in and aggregations on indexes.
	DialectMongoDB Dialect = iota
	// FerretDB hands SQLite only a filter that is exactly {_id: v}
	// (internal/backends/sqlite/collection.go, Filter.Len() == 1); any
	// other filter, sort or aggregation decodes the whole collection in
	// Go, a cost that grows with the collection (docs/embedded-store.md,
	// "One seam: the dialect"), but for the log's pages and the finds in
	// _id order that the embedded store's funnel serves from indexes.
	DialectFerretDB
)

func (d Dialect) String() string {
	if d == DialectFerretDB {
		return "ferretdb"
	}
	return "mongodb"
}

// DialectOf returns the dialect of the store c talks to, asked with
// buildInfo (FerretDB answers with a "ferretdbVersion" field). Errors wrap
// domain.ErrUnavailable when the store cannot be reached.
func DialectOf(ctx context.Context, c *mongo.Client) (Dialect, error) {
	var info bson.Raw
	err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info)
	if err != nil {
		return DialectMongoDB, fmt.Errorf("ask the store its build: %w", Translate(err))
	}
	if _, err := info.LookupErr("ferretdbVersion"); err == nil {
		return DialectFerretDB, nil
	}
	return DialectMongoDB, nil
}

// askDialect asks a client's store its dialect; tests override it.
var askDialect = DialectOf

// dialectOf is an adapter's dialect, asked of its database's client on
// first use and kept once the store answered; the zero value is ready.
type dialectOf struct {
	mu    sync.Mutex
	known bool
	d     Dialect
}

// of returns the dialect of db's store; errors as DialectOf's.
func (o *dialectOf) of(ctx context.Context, db *mongo.Database) (Dialect, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.known {
		return o.d, nil
	}
	d, err := askDialect(ctx, db.Client())
	if err != nil {
		return d, err
	}
	o.d, o.known = d, true
	return d, nil
}
