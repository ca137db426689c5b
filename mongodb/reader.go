package mongodb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// Reader answers queries on the read models.
// It reads each projection's active collection, following its pointer.
// A customer's stats and the daily sales are sums over the order
// summaries, computed on read: the summary holds everything they add up.
type Reader struct {
	db        *mongo.Database
	pointers  *Pointers
	sales     *projection.Rollup
	statsPage int // statsPage but in tests
	dialect   dialectOf
}

// NewReader returns a Reader on db's read models; sales (nil: none) is
// the daily sales rollup, read once built.
func NewReader(db *mongo.Database, ps *Pointers, sales *projection.Rollup) *Reader {
	return &Reader{db: db, pointers: ps, sales: sales, statsPage: statsPage}
}

// summaries returns the collection of the order summaries readers read.
// Errors: domain.ErrNotBuilt before a first build has switched to one,
// domain.ErrUnavailable.
func (r *Reader) summaries(ctx context.Context) (*mongo.Collection, error) {
	def := projection.OrderSummaries
	ptr, err := r.pointers.Last(ctx, def.Name, def.Collection, projection.ReaderPointerAge)
	if err != nil {
		return nil, err
	}
	if ptr.Active == "" {
		return nil, fmt.Errorf("%s: %w", def.Name, domain.ErrNotBuilt)
	}
	return r.db.Collection(ptr.Active, jsonTags), nil
}

// Summary returns an order's summary, or an error wrapping
// domain.ErrNotFound.
func (r *Reader) Summary(ctx context.Context, orderID string) (domain.Order, error) {
	coll, err := r.summaries(ctx)
	if err != nil {
		return domain.Order{}, err
	}
	d, found, err := findOne[stored[domain.Order]](ctx, coll, bson.D{{Key: "_id", Value: orderID}})
	if err == nil && !found {
		err = domain.ErrNotFound
	}
	if err != nil {
		return domain.Order{}, fmt.Errorf("order summary %s: %w", orderID, err)
	}
	return d.Doc, nil
}

// ListSummaries returns up to limit summaries in order id order, after the
// id after (exclusive; "" to start), filtered by customer and status when
// they are not empty. A full page means there may be more: the caller
// continues after the last id.
func (r *Reader) ListSummaries(ctx context.Context, customerID, status, after string, limit int) ([]domain.Order, error) {
	coll, err := r.summaries(ctx)
	if err != nil {
		return nil, err
	}
	docs, err := summaryPage[stored[domain.Order]](ctx, coll, customerID, status, after, limit, nil)
	if err != nil {
		return nil, fmt.Errorf("list summaries: %w", err)
	}
	out := make([]domain.Order, len(docs))
	for i, d := range docs {
		out[i] = d.Doc
	}
	return out, nil
}

// summaryPage reads up to limit summaries in _id order after the
// id after ("" to start), of one customer and one status where they are
// not empty, with projection unless it is nil: one find, on MongoDB
// through the (customer_id, _id), (status, _id) or _id index, and on the
// embedded store served from the same indexes by its funnel
// (docs/embedded-store.md, "Finds in _id order").
func summaryPage[T any](ctx context.Context, coll *mongo.Collection, customerID, status, after string, limit int, projection bson.D) ([]T, error) {
	filter := bson.D{}
	if customerID != "" {
		filter = append(filter, bson.E{Key: "customer_id", Value: customerID})
	}
	if status != "" {
		filter = append(filter, bson.E{Key: "status", Value: status})
	}
	if after != "" {
		filter = append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$gt", Value: after}}})
	}
	// The whole page in the first batch: MongoDB's first holds 101
	// documents unless told otherwise.
	opts := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)).SetBatchSize(int32(limit))
	if projection != nil {
		opts.SetProjection(projection)
	}
	return findAll[T](ctx, coll, filter, opts)
}

// statsPage is how many of a customer's summaries one find of the stats
// reads [1000]: all of them for nearly every customer. The embedded
// store's funnel serves a find of up to 2,048.
const statsPage = 1000

// statsSums is the part of an order summary a customer's stats add up.
type statsSums struct {
	ID         string        `bson:"_id"`
	Status     domain.Status `bson:"status"`
	Currency   string        `bson:"currency"`
	TotalCents int64         `bson:"total_cents"`
	RecordedAt time.Time     `bson:"recorded_at"`
}

// statsFields projects a summary on statsSums.
var statsFields = bson.D{{Key: "status", Value: 1}, {Key: "currency", Value: 1}, {Key: "total_cents", Value: 1}, {Key: "recorded_at", Value: 1}}

// CustomerStats sums a customer's order summaries (projection.SumStats).
// It returns an error wrapping domain.ErrNotFound when the customer has
// no order. It reads the customer's summaries, projected on what the
// stats add up, in pages of statsPage through the (customer_id, _id)
// index: one find for a customer with fewer orders, on both stores. A
// $group on MongoDB would read the same documents through the same index
// and send fewer bytes; a customer has few orders, and one path serves
// both stores (docs/embedded-store.md, "One seam: the dialect").
func (r *Reader) CustomerStats(ctx context.Context, customerID string) (domain.CustomerOrderStats, error) {
	coll, err := r.summaries(ctx)
	if err != nil {
		return domain.CustomerOrderStats{}, err
	}
	var gs []projection.StatsGroup
	for after := ""; ; {
		page, err := summaryPage[statsSums](ctx, coll, customerID, "", after, r.statsPage, statsFields)
		if err != nil {
			return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, err)
		}
		for _, o := range page {
			gs = append(gs, projection.StatsGroup{Status: o.Status, Currency: o.Currency, Orders: 1, TotalCents: o.TotalCents, RecordedAt: o.RecordedAt})
		}
		if len(page) < r.statsPage {
			break
		}
		after = page[len(page)-1].ID
	}
	stats := projection.SumStats(customerID, gs)
	if stats.OrderCount == 0 {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, domain.ErrNotFound)
	}
	return stats, nil
}

// DailySales returns the daily sales over the UTC dates of from to to
// (both included; the time of day is ignored), of one currency when
// currency is not empty, sorted by day then currency, days without
// orders left out, and the projection that answered: the daily_sales
// rollup (projection.Rollup.Sales, a document per year and currency)
// once built, the order summaries until then. Errors: domain.ErrNotBuilt
// before either is built, domain.ErrUnavailable.
func (r *Reader) DailySales(ctx context.Context, from, to time.Time, currency string) ([]domain.DailySales, string, error) {
	if r.sales != nil {
		days, err := r.sales.Sales(ctx, from, to, currency)
		if !errors.Is(err, domain.ErrNotBuilt) {
			return days, r.sales.Name(), err
		}
	}
	// Until the rollup's first build has switched, or while it is built
	// again after losing log positions: summed from the summaries.
	days, err := r.summedSales(ctx, from, to, currency)
	return days, projection.OrderSummaries.Name, err
}

// summedSales sums the order summaries per purchase day
// (projection.SaleDay of placed_at) and currency (projection.SumSales).
// On MongoDB the sum is one aggregation through the (placed_at, currency)
// index, grouped by day, currency and status: a few rows a day, but every
// order of the range read.
func (r *Reader) summedSales(ctx context.Context, from, to time.Time, currency string) ([]domain.DailySales, error) {
	coll, err := r.summaries(ctx)
	if err != nil {
		return nil, err
	}
	dialect, err := r.dialect.of(ctx, r.db)
	if err != nil {
		return nil, err
	}
	first, _ := time.Parse(time.DateOnly, projection.SaleDay(from))
	last, _ := time.Parse(time.DateOnly, projection.SaleDay(to))
	match := bson.D{{Key: "placed_at", Value: bson.D{{Key: "$gte", Value: first}, {Key: "$lt", Value: last.AddDate(0, 0, 1)}}}}
	if currency != "" {
		match = append(match, bson.E{Key: "currency", Value: currency})
	}
	var gs []projection.SalesGroup
	if dialect == DialectFerretDB {
		// As for CustomerStats: summed here.
		gs, err = perOrder(ctx, coll, match)
	} else {
		gs, err = grouped(ctx, coll, match)
	}
	if err != nil {
		return nil, fmt.Errorf("daily sales %s to %s: %w", projection.SaleDay(from), projection.SaleDay(to), err)
	}
	return projection.SumSales(gs), nil
}

// orderSums is the part of an order summary that the daily sales add up.
type orderSums struct {
	Status        domain.Status `bson:"status"`
	Currency      string        `bson:"currency"`
	ItemCount     int64         `bson:"item_count"`
	SubtotalCents int64         `bson:"subtotal_cents"`
	FreightCents  int64         `bson:"freight_cents"`
	PlacedAt      time.Time     `bson:"placed_at"`
}

// orderSumsFields projects a summary on orderSums.
var orderSumsFields = bson.D{{Key: "status", Value: 1}, {Key: "currency", Value: 1},
	{Key: "item_count", Value: 1}, {Key: "subtotal_cents", Value: 1}, {Key: "freight_cents", Value: 1},
	{Key: "placed_at", Value: 1}}

// perOrder reads the summaries match selects, one group of each.
func perOrder(ctx context.Context, coll *mongo.Collection, match bson.D) ([]projection.SalesGroup, error) {
	var out []projection.SalesGroup
	err := eachFound(ctx, coll, "read "+coll.Name(), match, options.Find().SetProjection(orderSumsFields), func(cur *mongo.Cursor) error {
		var o orderSums
		if err := cur.Decode(&o); err != nil {
			return err
		}
		out = append(out, projection.SalesGroup{Day: projection.SaleDay(o.PlacedAt), Currency: o.Currency, Status: o.Status, Orders: 1,
			ItemCount: o.ItemCount, SubtotalCents: o.SubtotalCents, FreightCents: o.FreightCents})
		return nil
	})
	return out, err
}

// orderGroup is a row of grouped's aggregation.
type orderGroup struct {
	Key struct {
		Day      string        `bson:"day"`
		Currency string        `bson:"currency"`
		Status   domain.Status `bson:"status"`
	} `bson:"_id"`
	Orders        int64 `bson:"orders"`
	ItemCount     int64 `bson:"item_count"`
	SubtotalCents int64 `bson:"subtotal_cents"`
	FreightCents  int64 `bson:"freight_cents"`
}

// grouped groups the summaries match selects by day, currency and status
// in one aggregation.
func grouped(ctx context.Context, coll *mongo.Collection, match bson.D) ([]projection.SalesGroup, error) {
	group := bson.D{
		{Key: "_id", Value: bson.D{
			{Key: "day", Value: bson.D{{Key: "$dateToString", Value: bson.D{{Key: "format", Value: "%Y-%m-%d"}, {Key: "date", Value: "$placed_at"}}}}},
			{Key: "currency", Value: "$currency"}, {Key: "status", Value: "$status"}}},
		{Key: "orders", Value: bson.D{{Key: "$sum", Value: 1}}},
		{Key: "item_count", Value: bson.D{{Key: "$sum", Value: "$item_count"}}},
		{Key: "subtotal_cents", Value: bson.D{{Key: "$sum", Value: "$subtotal_cents"}}},
		{Key: "freight_cents", Value: bson.D{{Key: "$sum", Value: "$freight_cents"}}},
	}
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{{{Key: "$match", Value: match}}, {{Key: "$group", Value: group}}})
	if err != nil {
		return nil, Translate(err)
	}
	var rows []orderGroup
	if err := cur.All(ctx, &rows); err != nil {
		return nil, Translate(err)
	}
	out := make([]projection.SalesGroup, len(rows))
	for i, g := range rows {
		out[i] = projection.SalesGroup{Day: g.Key.Day, Currency: g.Key.Currency, Status: g.Key.Status, Orders: g.Orders,
			ItemCount: g.ItemCount, SubtotalCents: g.SubtotalCents, FreightCents: g.FreightCents}
	}
	return out, nil
}
