package mongodb

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/projector"
)

// PartitionsCollection holds one lease document per partition of each
// projection: {_id: "<projection>/<NN>", projection, partition, owner,
// epoch, expires_at, acquired_at, renewed_at}. An owner whose expires_at
// has passed holds nothing; epoch counts the claims.
const PartitionsCollection = "projection_partitions"

// Partitions are the leases of one projection's partitions, numbered from
// 0, each held by one projector process at a time (see Leases). A
// partition's lease document exists from Ensure on, so a claim of a
// partition taken by another process costs one round trip.
type Partitions struct {
	leases     *Leases
	projection string
}

// NewPartitions returns the partition leases of projection in db's
// PartitionsCollection.
func NewPartitions(db *mongo.Database, projection string) *Partitions {
	return &Partitions{leases: NewLeases(db, PartitionsCollection), projection: projection}
}

// name is partition p's lease name: "<projection>/<NN>".
func (s *Partitions) name(p int) string { return fmt.Sprintf("%s/%02d", s.projection, p) }

// Ensure creates the lease documents of partitions 0..n-1 that do not
// exist yet, free. A racing process's insert of the same document is a
// duplicate key, ignored.
func (s *Partitions) Ensure(ctx context.Context, n int) error {
	have, err := s.stored(ctx)
	if err != nil {
		return err
	}
	for p := range n {
		if _, ok := have[p]; ok {
			continue
		}
		_, err := s.leases.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: s.name(p)}, {Key: "projection", Value: s.projection},
			{Key: "partition", Value: p}, {Key: "owner", Value: ""}, {Key: "expires_at", Value: time.Unix(0, 0).UTC()},
			{Key: "acquired_at", Value: time.Time{}}, {Key: "renewed_at", Value: time.Time{}}, {Key: "epoch", Value: int64(0)}})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("create partition %s: %w", s.name(p), Translate(err))
		}
	}
	return nil
}

// Remove deletes every partition lease of the projection, for a version
// of a projection that no process runs any more. Errors:
// domain.ErrUnavailable.
func (s *Partitions) Remove(ctx context.Context) error {
	if _, err := s.leases.coll.DeleteMany(ctx, bson.D{{Key: "projection", Value: s.projection}}); err != nil {
		return fmt.Errorf("remove the partitions of %s: %w", s.projection, Translate(err))
	}
	return nil
}

// List returns the leases of partitions 0..n-1, element p being partition
// p's, as stored (a filter on a small collection); a partition without a
// document yet is free, with only its Name set.
func (s *Partitions) List(ctx context.Context, n int) ([]projector.Lease, error) {
	have, err := s.stored(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]projector.Lease, n)
	for p := range out {
		if lease, ok := have[p]; ok {
			out[p] = lease
		} else {
			out[p] = projector.Lease{Name: s.name(p)}
		}
	}
	return out, nil
}

// stored returns the projection's partition leases by partition.
func (s *Partitions) stored(ctx context.Context) (map[int]projector.Lease, error) {
	cur, err := s.leases.coll.Find(ctx, bson.D{{Key: "projection", Value: s.projection}})
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", s.projection, Translate(err))
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", s.projection, Translate(err))
	}
	out := make(map[int]projector.Lease, len(docs))
	for _, d := range docs {
		p, ok := d.Lookup("partition").AsInt64OK()
		if !ok {
			continue
		}
		out[int(p)] = s.leases.decode(d)
	}
	return out, nil
}

// Claim takes partition p for holder for ttl if it is free, has expired,
// or is already holder's (a restart under the same instance id), raising
// its epoch. It returns the new claim and true, or false and no error
// when another holder has it or got it first.
func (s *Partitions) Claim(ctx context.Context, p int, holder string, ttl time.Duration) (projector.Lease, bool, error) {
	now := s.leases.now()
	lease, ok, err := s.leases.claim(ctx, s.name(p), holder, ttl, now, s.leases.free(holder, now), nil)
	if err != nil {
		return lease, ok, fmt.Errorf("partition %d of %s: %w", p, s.projection, err)
	}
	return lease, ok, nil
}

// Renew extends every lease of leases by ttl, in one update (see
// Leases.RenewAll), and returns those still held, renewed.
func (s *Partitions) Renew(ctx context.Context, leases []projector.Lease, ttl time.Duration) ([]projector.Lease, error) {
	return s.leases.RenewAll(ctx, leases, ttl)
}

// Release frees a partition's lease (see Leases.Release). Errors:
// domain.ErrLeaseLost when it had passed to another claim.
func (s *Partitions) Release(ctx context.Context, lease projector.Lease) error {
	return s.leases.Release(ctx, lease)
}
