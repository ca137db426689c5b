package mongodb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/projection"
)

// Rollups keeps a rollup's collections (projection.RollupStore): one
// document per year and currency,
//
//	{_id: "YYYY|<currency>", year, currency, days: BinData, position, merged, retried, rev}
//
// every write a compare-and-set on rev; the collection's cursor in the
// document "~cursor" ({position, seq, cut}: "~" sorts after every year),
// written only over a lower position; and a build's contributions in
// projection.SumsCollection(coll), one document per stream. A range of
// years is one find on an _id range, which the embedded store serves
// from its _id index.
//
// days packs the year's days with sales (packDays): a full year is about
// 5.5 KB, where a subdocument per day with six named sums is about 37 KB.
// Measured on the embedded store (FerretDB 1.24 decodes each value of a
// stored document through encoding/json): a find of ten year documents
// takes 8 ms packed, against 16 ms for 12 KB each and 31 ms for 120 month
// documents; a month of 30 such subdocuments alone took 3.5 ms to read.
// On MongoDB the packed form is what each batch's write replicates.
type Rollups struct {
	db *mongo.Database
}

var _ projection.RollupStore = (*Rollups)(nil)

// NewRollups returns the rollup collections kept in db.
func NewRollups(db *mongo.Database) *Rollups { return &Rollups{db: db} }

// cursorID is the _id of a rollup collection's cursor.
const cursorID = "~cursor"

// yearDoc is the stored form of a projection.SalesYear.
type yearDoc struct {
	ID       string   `bson:"_id"`
	Year     string   `bson:"year"`
	Currency string   `bson:"currency"`
	Days     []byte   `bson:"days"`
	Position int64    `bson:"position"`
	Merged   string   `bson:"merged,omitempty"`
	Retried  []string `bson:"retried,omitempty"`
	Rev      int64    `bson:"rev"`
}

// dayDoc is a day's sums as a build's contribution stores them.
type dayDoc struct {
	Orders       int64 `bson:"orders"`
	Items        int64 `bson:"items"`
	GrossCents   int64 `bson:"gross_cents"`
	FreightCents int64 `bson:"freight_cents"`
	Canceled     int64 `bson:"canceled"`
	Unavailable  int64 `bson:"unavailable"`
}

func toYearDoc(y projection.SalesYear) (yearDoc, error) {
	days, err := packDays(y.Year, y.Days)
	return yearDoc{ID: y.ID, Year: y.Year, Currency: y.Currency, Days: days, Position: int64(y.Position),
		Merged: y.Merged, Retried: y.Retried, Rev: int64(y.Rev)}, err
}

func (d yearDoc) year() (projection.SalesYear, error) {
	days, err := unpackDays(d.Year, d.Days)
	if err != nil {
		return projection.SalesYear{}, fmt.Errorf("%s: %w", d.ID, err)
	}
	return projection.SalesYear{ID: d.ID, Year: d.Year, Currency: d.Currency, Days: days,
		Position: uint64(d.Position), Merged: d.Merged, Retried: d.Retried, Rev: uint64(d.Rev)}, nil
}

// packDays packs the days (YYYY-MM-DD, all of year) in day order, each
// as varints (encoding/binary): its day of the year, then its orders,
// items, gross, freight, canceled and unavailable. Days whose sums are
// all zero are left out.
func packDays(year string, days map[string]projection.DaySales) ([]byte, error) {
	out := make([]byte, 0, 16*len(days))
	for _, day := range slices.Sorted(maps.Keys(days)) {
		t, err := time.Parse(time.DateOnly, day)
		if err != nil || day[:4] != year {
			return nil, fmt.Errorf("day %q of year %s", day, year)
		}
		s := days[day]
		if s == (projection.DaySales{}) {
			continue
		}
		out = binary.AppendUvarint(out, uint64(t.YearDay()))
		for _, v := range []int64{s.Orders, s.Items, s.GrossCents, s.FreightCents, s.Canceled, s.Unavailable} {
			out = binary.AppendVarint(out, v)
		}
	}
	return out, nil
}

// unpackDays is packDays' inverse.
func unpackDays(year string, b []byte) (map[string]projection.DaySales, error) {
	y, err := strconv.Atoi(year)
	if err != nil {
		return nil, fmt.Errorf("year %q", year)
	}
	jan1 := time.Date(y, time.January, 1, 0, 0, 0, 0, time.UTC)
	days := map[string]projection.DaySales{}
	for len(b) > 0 {
		yd, n := binary.Uvarint(b)
		if n <= 0 || yd < 1 || yd > 366 {
			return nil, errors.New("days: a day of the year out of range")
		}
		b = b[n:]
		var v [6]int64
		for i := range v {
			if v[i], n = binary.Varint(b); n <= 0 {
				return nil, errors.New("days: truncated")
			}
			b = b[n:]
		}
		days[jan1.AddDate(0, 0, int(yd)-1).Format(time.DateOnly)] = projection.DaySales{Orders: v[0], Items: v[1],
			GrossCents: v[2], FreightCents: v[3], Canceled: v[4], Unavailable: v[5]}
	}
	return days, nil
}

// LoadYear reads year id of coll by _id; false when it has none.
func (s *Rollups) LoadYear(ctx context.Context, coll, id string) (projection.SalesYear, bool, error) {
	d, found, err := findOne[yearDoc](ctx, s.db.Collection(coll), bson.D{{Key: "_id", Value: id}})
	if err != nil || !found {
		return projection.SalesYear{}, false, err
	}
	y, err := d.year()
	return y, err == nil, err
}

// SaveYear inserts a year at revision 1, and replaces one filtered on
// {_id, rev: m.Rev-1} otherwise.
func (s *Rollups) SaveYear(ctx context.Context, coll string, m projection.SalesYear) (bool, error) {
	d, err := toYearDoc(m)
	if err != nil {
		return false, err
	}
	c := s.db.Collection(coll)
	if m.Rev <= 1 {
		_, err := c.InsertOne(ctx, d)
		if mongo.IsDuplicateKeyError(err) {
			return false, nil
		}
		return err == nil, Translate(err)
	}
	res, err := c.ReplaceOne(ctx, bson.D{{Key: "_id", Value: m.ID}, {Key: "rev", Value: int64(m.Rev - 1)}}, d)
	if err != nil {
		return false, Translate(err)
	}
	return res.MatchedCount == 1, nil
}

// Years reads the years of an _id range in one find, sorted by _id.
func (s *Rollups) Years(ctx context.Context, coll, from, to string) ([]projection.SalesYear, error) {
	docs, err := findAll[yearDoc](ctx, s.db.Collection(coll), bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: from}, {Key: "$lte", Value: to}}}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	out := make([]projection.SalesYear, 0, len(docs))
	for _, d := range docs {
		if d.ID == cursorID {
			continue
		}
		y, err := d.year()
		if err != nil {
			return nil, err
		}
		out = append(out, y)
	}
	return out, nil
}

// cursorDoc is the stored form of a projection.RollupCursor.
type cursorDoc struct {
	ID       string    `bson:"_id"`
	Position int64     `bson:"position"`
	Seq      int64     `bson:"seq"`
	Cut      time.Time `bson:"cut,omitempty"`
}

// Cursor reads the cursor by _id.
func (s *Rollups) Cursor(ctx context.Context, coll string) (projection.RollupCursor, bool, error) {
	d, found, err := findOne[cursorDoc](ctx, s.db.Collection(coll), bson.D{{Key: "_id", Value: cursorID}})
	return projection.RollupCursor{Position: uint64(d.Position), Seq: uint64(d.Seq), Cut: d.Cut}, found, err
}

// SaveCursor is a replacement with upsert filtered on a lower position: a
// duplicate key means the stored cursor is at c's position or past it.
func (s *Rollups) SaveCursor(ctx context.Context, coll string, c projection.RollupCursor) error {
	d := cursorDoc{ID: cursorID, Position: int64(c.Position), Seq: int64(c.Seq), Cut: c.Cut}
	filter := bson.D{{Key: "_id", Value: cursorID}, {Key: "position", Value: bson.D{{Key: "$lt", Value: d.Position}}}}
	if c.Position == 0 {
		// A build's shadow starting at the log's first position: there
		// is no lower one to guard on.
		filter = bson.D{{Key: "_id", Value: cursorID}}
	}
	_, err := s.db.Collection(coll).ReplaceOne(ctx, filter, d, options.Replace().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return nil
	}
	return Translate(err)
}

// contributionDoc is the stored form of a projection.Contribution.
type contributionDoc struct {
	ID       string `bson:"_id"`
	Day      string `bson:"day"`
	Currency string `bson:"currency"`
	Sales    dayDoc `bson:"sales"`
}

// SaveContributions records the contributions (see insertOrReplace).
func (s *Rollups) SaveContributions(ctx context.Context, coll string, cs []projection.Contribution) error {
	docs := make([]contributionDoc, len(cs))
	for i, c := range cs {
		docs[i] = contributionDoc{ID: c.Stream, Day: c.Day, Currency: c.Currency, Sales: dayDoc(c.Sales)}
	}
	return insertOrReplace(ctx, s.db.Collection(projection.SumsCollection(coll)), docs, func(d contributionDoc) string { return d.ID })
}

// EachContribution reads the contributions in batches of 1,000.
func (s *Rollups) EachContribution(ctx context.Context, coll string, fn func(projection.Contribution) error) error {
	return eachDoc(ctx, s.db.Collection(projection.SumsCollection(coll)), func(d contributionDoc) error {
		return fn(projection.Contribution{Stream: d.ID, Day: d.Day, Currency: d.Currency, Sales: projection.DaySales(d.Sales)})
	})
}
