package embedded

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // the SQLite driver FerretDB itself uses
)

// idIndex gives every collection's SQLite table the index FerretDB 1.24
// lacks for its own _id look-ups, on the expression its queries use
// (_ferretdb_sjson->'$._id'; its own index is on ->"_id", so every look-up
// scanned the table: docs/embedded-store.md, "Indexed _id"), and the log's
// table those that serve its pages (logpage.go). It indexes every table at
// start and each collection a write names that it has not seen.
type idIndex struct {
	dir string

	mu   sync.Mutex
	dbs  map[string]*sql.DB // one handle per database file
	done map[[2]string]bool // {db, collection} known to have the index
}

func newIDIndex(dir string) *idIndex {
	return &idIndex{dir: dir, dbs: map[string]*sql.DB{}, done: map[[2]string]bool{}}
}

// ensure indexes collection coll of database db if it exists and has not
// been indexed since it was last seen dropped. It is idempotent.
func (x *idIndex) ensure(ctx context.Context, db, coll string) error {
	if db == "" || coll == "" {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done[[2]string{db, coll}] {
		return nil
	}
	h, err := x.open(db)
	if err != nil || h == nil {
		return err
	}
	table, _, err := tableOf(h, coll)
	if err != nil || table == "" { // none: the write created nothing (a delete or a failed insert)
		return err
	}
	indexes := map[string]string{"_id_path": idJSON}
	if coll == LogCollection {
		maps.Copy(indexes, logIndexes)
	}
	for suffix, columns := range indexes {
		q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (%s)`, table+suffix, table, columns)
		if _, err := h.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("create index %s: %w", table+suffix, err)
		}
	}
	x.done[[2]string{db, coll}] = true
	return nil
}

// ensureAll indexes every collection of every database in the directory;
// run at start, before any client connects.
func (x *idIndex) ensureAll(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(x.dir, "*.sqlite"))
	if err != nil {
		return err
	}
	for _, f := range files {
		db := strings.TrimSuffix(filepath.Base(f), ".sqlite")
		h, err := x.open(db)
		if err != nil || h == nil {
			return err
		}
		var names string
		err = h.QueryRowContext(ctx, `SELECT json_group_array(name) FROM _ferretdb_collections`).Scan(&names)
		if isNoSuchTable(err) {
			continue
		}
		var colls []string
		if err := errors.Join(err, json.Unmarshal([]byte(names), &colls)); err != nil {
			return fmt.Errorf("list collections of %s: %w", db, err)
		}
		for _, c := range colls {
			if err := x.ensure(ctx, db, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// forget marks collection coll of db as not indexed (dropped):
// the next write to that name checks again. With coll "" it forgets every
// collection of db and closes the handle of its file (a dropped database),
// and with db "" too every handle (the store's close).
func (x *idIndex) forget(db, coll string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.done {
		if k[0] == db && (coll == "" || k[1] == coll) {
			delete(x.done, k)
		}
	}
	for name, h := range x.dbs {
		if coll == "" && (db == "" || name == db) {
			_ = h.Close()
			delete(x.dbs, name)
		}
	}
}

// handle returns the handle of database db's file, nil when FerretDB has
// not created the file. The funnel's finds and change streams read
// through it while FerretDB writes (WAL).
func (x *idIndex) handle(db string) (*sql.DB, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.open(db)
}

// open is handle with x.mu held.
func (x *idIndex) open(db string) (*sql.DB, error) {
	if h := x.dbs[db]; h != nil {
		return h, nil
	}
	if db == "" || db != filepath.Base(db) || strings.ContainsAny(db, "?#") {
		return nil, fmt.Errorf("database name %q", db)
	}
	path := filepath.Join(x.dir, db+".sqlite")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	// As FerretDB opens its files (StartStore): replaceRows commits as its
	// writes do, and an index creation waits as long for the write lock.
	h, err := sql.Open("sqlite", "file:"+path+"?mode=rw&_pragma=busy_timeout(10000)&_pragma=synchronous(normal)&_pragma=temp_store(memory)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	h.SetMaxOpenConns(4)
	x.dbs[db] = h
	return h, nil
}

// tableOf returns the SQLite table of collection coll in h and its
// settings (FerretDB's JSON); "" when there is no such collection.
func tableOf(h interface {
	QueryRow(string, ...any) *sql.Row
}, coll string) (table, settings string, err error) {
	err = h.QueryRow(`SELECT table_name, settings FROM _ferretdb_collections WHERE name = ?`, coll).Scan(&table, &settings)
	if errors.Is(err, sql.ErrNoRows) || isNoSuchTable(err) {
		return "", "", nil
	}
	return table, settings, err
}

func isNoSuchTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}
