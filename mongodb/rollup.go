package mongodb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/projection"
)

// Rollups keeps a rollup's collections (projection.RollupStore): one
// document per month and currency,
//
//	{_id: "YYYY-MM|<currency>", month, currency, days: {"YYYY-MM-DD": {orders, items,
//	 gross_cents, freight_cents, canceled, unavailable}}, position, merged, retried, rev}
//
// every write a compare-and-set on rev; the collection's cursor in the
// document "~cursor" ({position, seq, cut}: "~" sorts after every month),
// written only over a lower position; and a build's contributions in
// projection.SumsCollection(coll), one document per stream. A range of
// months is one find on an _id range, which the embedded store serves
// from its _id index.
type Rollups struct {
	db *mongo.Database
}

var _ projection.RollupStore = (*Rollups)(nil)

// NewRollups returns the rollup collections kept in db.
func NewRollups(db *mongo.Database) *Rollups { return &Rollups{db: db} }

// cursorID is the _id of a rollup collection's cursor.
const cursorID = "~cursor"

// monthDoc is the stored form of a projection.SalesMonth.
type monthDoc struct {
	ID       string            `bson:"_id"`
	Month    string            `bson:"month"`
	Currency string            `bson:"currency"`
	Days     map[string]dayDoc `bson:"days"`
	Position int64             `bson:"position"`
	Merged   string            `bson:"merged,omitempty"`
	Retried  []string          `bson:"retried,omitempty"`
	Rev      int64             `bson:"rev"`
}

type dayDoc struct {
	Orders       int64 `bson:"orders"`
	Items        int64 `bson:"items"`
	GrossCents   int64 `bson:"gross_cents"`
	FreightCents int64 `bson:"freight_cents"`
	Canceled     int64 `bson:"canceled"`
	Unavailable  int64 `bson:"unavailable"`
}

func toMonthDoc(m projection.SalesMonth) monthDoc {
	d := monthDoc{ID: m.ID, Month: m.Month, Currency: m.Currency, Days: map[string]dayDoc{}, Position: int64(m.Position),
		Merged: m.Merged, Retried: m.Retried, Rev: int64(m.Rev)}
	for day, s := range m.Days {
		d.Days[day] = dayDoc(s)
	}
	return d
}

func (d monthDoc) month() projection.SalesMonth {
	m := projection.SalesMonth{ID: d.ID, Month: d.Month, Currency: d.Currency, Days: map[string]projection.DaySales{},
		Position: uint64(d.Position), Merged: d.Merged, Retried: d.Retried, Rev: uint64(d.Rev)}
	for day, s := range d.Days {
		m.Days[day] = projection.DaySales(s)
	}
	return m
}

// LoadMonths reads the months by _id, one look-up each (a handful).
func (s *Rollups) LoadMonths(ctx context.Context, coll string, ids []string) (map[string]projection.SalesMonth, error) {
	out := make(map[string]projection.SalesMonth, len(ids))
	for _, id := range ids {
		var d monthDoc
		err := s.db.Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return nil, Translate(err)
		}
		out[id] = d.month()
	}
	return out, nil
}

// SaveMonth inserts a month at revision 1, and replaces one filtered on
// {_id, rev: m.Rev-1} otherwise.
func (s *Rollups) SaveMonth(ctx context.Context, coll string, m projection.SalesMonth) (bool, error) {
	d := toMonthDoc(m)
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

// Months reads the months of an _id range in one find, sorted by _id.
func (s *Rollups) Months(ctx context.Context, coll, from, to string) ([]projection.SalesMonth, error) {
	cur, err := s.db.Collection(coll).Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: from}, {Key: "$lte", Value: to}}}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, Translate(err)
	}
	var docs []monthDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, Translate(err)
	}
	out := make([]projection.SalesMonth, 0, len(docs))
	for _, d := range docs {
		if d.ID != cursorID {
			out = append(out, d.month())
		}
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
	var d cursorDoc
	err := s.db.Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: cursorID}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return projection.RollupCursor{}, false, nil
	}
	if err != nil {
		return projection.RollupCursor{}, false, Translate(err)
	}
	return projection.RollupCursor{Position: uint64(d.Position), Seq: uint64(d.Seq), Cut: d.Cut}, true, nil
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

// SaveContributions inserts the contributions unordered and replaces, by
// _id, those already recorded (a scan resumed from its cursor).
func (s *Rollups) SaveContributions(ctx context.Context, coll string, cs []projection.Contribution) error {
	docs := make([]contributionDoc, len(cs))
	body := make([]any, len(cs))
	for i, c := range cs {
		docs[i] = contributionDoc{ID: c.Stream, Day: c.Day, Currency: c.Currency, Sales: dayDoc(c.Sales)}
		body[i] = docs[i]
	}
	sc := s.db.Collection(projection.SumsCollection(coll))
	_, err := sc.InsertMany(ctx, body, options.InsertMany().SetOrdered(false))
	if err == nil {
		return nil
	}
	taken, err := splitSuperseded(err)
	if err != nil {
		return Translate(err)
	}
	for i := range taken {
		if _, err := sc.ReplaceOne(ctx, bson.D{{Key: "_id", Value: docs[i].ID}}, docs[i], options.Replace().SetUpsert(true)); err != nil {
			return fmt.Errorf("the contribution of %s: %w", docs[i].ID, Translate(err))
		}
	}
	return nil
}

// EachContribution reads the contributions in batches of 1,000.
func (s *Rollups) EachContribution(ctx context.Context, coll string, fn func(projection.Contribution) error) error {
	cur, err := s.db.Collection(projection.SumsCollection(coll)).Find(ctx, bson.D{}, options.Find().SetBatchSize(1000))
	if err != nil {
		return Translate(err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		var d contributionDoc
		if err := cur.Decode(&d); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		if err := fn(projection.Contribution{Stream: d.ID, Day: d.Day, Currency: d.Currency, Sales: projection.DaySales(d.Sales)}); err != nil {
			return err
		}
	}
	return Translate(cur.Err())
}

// DropSums drops the contributions recorded for coll.
func (s *Rollups) DropSums(ctx context.Context, coll string) error {
	if err := s.db.Collection(projection.SumsCollection(coll)).Drop(ctx); err != nil {
		return fmt.Errorf("drop %s: %w", projection.SumsCollection(coll), Translate(err))
	}
	return nil
}
