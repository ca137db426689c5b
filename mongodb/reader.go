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
type Reader struct {
	summaries *Projection[domain.Order]
	stats     *Projection[projection.Contribution]
	sales     *Projection[projection.Sale]
}

// NewReader returns a Reader on db's read models.
func NewReader(db *mongo.Database, ps *Pointers) *Reader {
	return &Reader{summaries: NewProjection(db, projection.OrderSummaries, nil, nil, ps), stats: NewProjection(db, projection.CustomerOrderStats, nil, nil, ps),
		sales: NewProjection(db, projection.DailySales, nil, nil, ps)}
}

// Summary returns an order's summary, or an error wrapping
// domain.ErrNotFound.
func (r *Reader) Summary(ctx context.Context, orderID string) (domain.Order, error) {
	return r.summaries.Get(ctx, orderID)
}

// ListSummaries returns up to limit summaries in order id order, after the
// id after (exclusive; "" to start), filtered by customer and status when
// they are not empty. A full page means there may be more: the caller
// continues after the last id.
func (r *Reader) ListSummaries(ctx context.Context, customerID, status, after string, limit int) ([]domain.Order, error) {
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
	s, err := r.summaries.Active(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := s.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("list summaries: %w", Translate(err))
	}
	var docs []stored[domain.Order]
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("list summaries: %w", Translate(err))
	}
	out := make([]domain.Order, len(docs))
	for i, d := range docs {
		out[i] = d.Doc
	}
	return out, nil
}

// CustomerStats sums a customer's order contributions. It returns an error
// wrapping domain.ErrNotFound when the customer has none. On MongoDB the
// sum is one aggregation through the customer_id index, grouped by status
// and currency (a few rows whatever the customer's order count), and one
// find of the newest recorded_at (the stats' RecordedAt).
func (r *Reader) CustomerStats(ctx context.Context, customerID string) (domain.CustomerOrderStats, error) {
	s, err := r.stats.Active(ctx)
	if err != nil {
		return domain.CustomerOrderStats{}, err
	}
	dialect, err := DialectOf(ctx, s.coll.Database().Client())
	if err != nil {
		return domain.CustomerOrderStats{}, err
	}
	var (
		cs     []projection.Contribution
		newest time.Time
	)
	if dialect == DialectFerretDB {
		// FerretDB 1.24 feeds a $group's documents to its first
		// accumulator only (the others answer 0): the contributions are
		// read and summed here.
		cs, err = s.contributions(ctx, customerID)
	} else {
		cs, err = s.contributionsByStatus(ctx, customerID)
		if err == nil {
			newest, err = s.newestRecordedAt(ctx, customerID)
		}
	}
	if err != nil {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, err)
	}
	stats := projection.SumContributions(customerID, cs)
	if newest.After(stats.RecordedAt) {
		stats.RecordedAt = newest
	}
	if stats.OrderCount == 0 {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, domain.ErrNotFound)
	}
	return stats, nil
}

// contributions reads a customer's contributions, one per order.
func (s *ReadModel[D]) contributions(ctx context.Context, customerID string) ([]projection.Contribution, error) {
	cur, err := s.coll.Find(ctx, bson.D{{Key: "customer_id", Value: customerID}})
	if err != nil {
		return nil, Translate(err)
	}
	var docs []stored[projection.Contribution]
	if err := cur.All(ctx, &docs); err != nil {
		return nil, Translate(err)
	}
	cs := make([]projection.Contribution, len(docs))
	for i, d := range docs {
		cs[i] = d.Doc
	}
	return cs, nil
}

// newestRecordedAt returns the newest recorded_at of the customer's
// contributions (zero when none has one), for the stats' RecordedAt: a
// $max accumulator in the aggregation would save this read, but FerretDB
// 1.24 has none. MongoDB answers it through the customer_id index, sorting
// the customer's few documents.
func (s *ReadModel[D]) newestRecordedAt(ctx context.Context, customerID string) (time.Time, error) {
	var d struct {
		RecordedAt time.Time `bson:"recorded_at"`
	}
	err := s.coll.FindOne(ctx, bson.D{{Key: "customer_id", Value: customerID}},
		options.FindOne().SetSort(bson.D{{Key: "recorded_at", Value: -1}}).SetProjection(bson.D{{Key: "recorded_at", Value: 1}})).Decode(&d)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return time.Time{}, Translate(err)
	}
	return d.RecordedAt, nil
}

// contributionsByStatus sums a customer's contributions on the server by
// status and currency: each returned projection.Contribution stands for Orders orders.
func (s *ReadModel[D]) contributionsByStatus(ctx context.Context, customerID string) ([]projection.Contribution, error) {
	cur, err := s.coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "customer_id", Value: customerID}}}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "status", Value: "$status"}, {Key: "currency", Value: "$currency"}}},
			{Key: "orders", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "total_cents", Value: bson.D{{Key: "$sum", Value: "$total_cents"}}},
		}}},
	})
	if err != nil {
		return nil, Translate(err)
	}
	var groups []struct {
		Key struct {
			Status   domain.Status `bson:"status"`
			Currency string        `bson:"currency"`
		} `bson:"_id"`
		Orders     int64 `bson:"orders"`
		TotalCents int64 `bson:"total_cents"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, Translate(err)
	}
	cs := make([]projection.Contribution, len(groups))
	for i, g := range groups {
		cs[i] = projection.Contribution{CustomerID: customerID, Status: g.Key.Status, Currency: g.Key.Currency, TotalCents: g.TotalCents, Orders: g.Orders}
	}
	return cs, nil
}

// DailySales sums the daily_sales read model per purchase day and
// currency over the UTC dates of from to to (both inclusive; the time of
// day is ignored), of one currency when currency is not empty. Rows are
// sorted by day then currency; days without orders have none. On MongoDB
// the sum is one aggregation through the (day, currency) index, grouped
// by day, currency and status (a few rows a day whatever the order count).
func (r *Reader) DailySales(ctx context.Context, from, to time.Time, currency string) ([]domain.DailySales, error) {
	s, err := r.sales.Active(ctx)
	if err != nil {
		return nil, err
	}
	dialect, err := DialectOf(ctx, s.coll.Database().Client())
	if err != nil {
		return nil, err
	}
	filter := bson.D{{Key: "day", Value: bson.D{{Key: "$gte", Value: projection.SaleDay(from)}, {Key: "$lte", Value: projection.SaleDay(to)}}}}
	if currency != "" {
		filter = append(filter, bson.E{Key: "currency", Value: currency})
	}
	var sales []projection.Sale
	if dialect == DialectFerretDB {
		// FerretDB 1.24 feeds a $group's documents to its first
		// accumulator only (the others answer 0): the sales are read and
		// summed here.
		sales, err = s.sales(ctx, filter)
	} else {
		sales, err = s.salesByStatus(ctx, filter)
	}
	if err != nil {
		return nil, fmt.Errorf("daily sales %s to %s: %w", projection.SaleDay(from), projection.SaleDay(to), err)
	}
	return projection.SumSales(sales), nil
}

// sales reads the sales that filter matches, one per order.
func (s *ReadModel[D]) sales(ctx context.Context, filter bson.D) ([]projection.Sale, error) {
	cur, err := s.coll.Find(ctx, filter)
	if err != nil {
		return nil, Translate(err)
	}
	var docs []stored[projection.Sale]
	if err := cur.All(ctx, &docs); err != nil {
		return nil, Translate(err)
	}
	out := make([]projection.Sale, len(docs))
	for i, d := range docs {
		out[i] = d.Doc
	}
	return out, nil
}

// salesByStatus sums the sales that filter matches on the server by day,
// currency and status: each returned projection.Sale stands for Orders
// orders.
func (s *ReadModel[D]) salesByStatus(ctx context.Context, filter bson.D) ([]projection.Sale, error) {
	cur, err := s.coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: filter}},
		{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "day", Value: "$day"}, {Key: "currency", Value: "$currency"}, {Key: "status", Value: "$status"}}},
			{Key: "orders", Value: bson.D{{Key: "$sum", Value: 1}}},
			{Key: "item_count", Value: bson.D{{Key: "$sum", Value: "$item_count"}}},
			{Key: "subtotal_cents", Value: bson.D{{Key: "$sum", Value: "$subtotal_cents"}}},
			{Key: "freight_cents", Value: bson.D{{Key: "$sum", Value: "$freight_cents"}}},
		}}},
	})
	if err != nil {
		return nil, Translate(err)
	}
	var groups []struct {
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
	if err := cur.All(ctx, &groups); err != nil {
		return nil, Translate(err)
	}
	out := make([]projection.Sale, len(groups))
	for i, g := range groups {
		out[i] = projection.Sale{Day: g.Key.Day, Currency: g.Key.Currency, Status: g.Key.Status, ItemCount: g.ItemCount,
			SubtotalCents: g.SubtotalCents, FreightCents: g.FreightCents, Orders: g.Orders}
	}
	return out, nil
}
