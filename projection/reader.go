package projection

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/domain"
	mongoerr "github.com/orderd/orderd/mongodb"
)

// Reader answers queries on the read models.
// It reads each projection's active collection, following its pointer.
type Reader struct {
	summaries *Projection[domain.Order]
	stats     *Projection[Contribution]
}

// NewReader returns a Reader on db's read models.
func NewReader(db *mongo.Database, ps *Pointers) *Reader {
	return &Reader{summaries: NewProjection(db, OrderSummaries, nil, nil, ps), stats: NewProjection(db, CustomerOrderStats, nil, nil, ps)}
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
		return nil, fmt.Errorf("list summaries: %w", mongoerr.Translate(err))
	}
	var docs []stored[domain.Order]
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("list summaries: %w", mongoerr.Translate(err))
	}
	out := make([]domain.Order, len(docs))
	for i, d := range docs {
		out[i] = d.Doc
	}
	return out, nil
}

// CustomerStats sums a customer's order contributions. It returns an error
// wrapping domain.ErrNotFound when the customer has none. The sum is taken
// here rather than with $group: FerretDB 1.24 answers $sum of a field path
// with 0.
func (r *Reader) CustomerStats(ctx context.Context, customerID string) (domain.CustomerOrderStats, error) {
	s, err := r.stats.Active(ctx)
	if err != nil {
		return domain.CustomerOrderStats{}, err
	}
	cur, err := s.coll.Find(ctx, bson.D{{Key: "customer_id", Value: customerID}})
	if err != nil {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, mongoerr.Translate(err))
	}
	var docs []stored[Contribution]
	if err := cur.All(ctx, &docs); err != nil {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, mongoerr.Translate(err))
	}
	if len(docs) == 0 {
		return domain.CustomerOrderStats{}, fmt.Errorf("customer %s stats: %w", customerID, domain.ErrNotFound)
	}
	cs := make([]Contribution, len(docs))
	for i, d := range docs {
		cs[i] = d.Doc
	}
	return SumContributions(customerID, cs), nil
}

// SumContributions adds up a customer's contributions.
func SumContributions(customerID string, cs []Contribution) domain.CustomerOrderStats {
	s := domain.CustomerOrderStats{CustomerID: customerID, ByStatus: map[domain.Status]int64{}, LifetimeValueCents: map[string]int64{}}
	for _, c := range cs {
		s.OrderCount++
		s.ByStatus[c.Status]++
		if domain.CountsTowardValue(c.Status) {
			s.LifetimeValueCents[c.Currency] += c.TotalCents
		}
	}
	return s
}
