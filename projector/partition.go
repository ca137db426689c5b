package projector

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/mongodb"
)

// PartitionsCollection holds one lease document per partition of each
// projection: {_id: "<projection>/<NN>", projection, partition, owner,
// expires_at, acquired_at, renewed_at, epoch}. An owner
// whose expires_at has passed holds nothing; epoch counts the tenures.
const PartitionsCollection = "projection_partitions"

// MembersCollection holds one heartbeat document per projector process
// and projection: {_id: "<projection>/<owner>", projection, owner,
// expires_at, partitions: [{partition, applied, rate}]}. The live members
// (expires_at in the future) share the partitions; each reports what it
// applied in the partitions it holds.
const MembersCollection = "projection_members"

// DefaultPartitions is how many partitions a projection's events are
// split into when RunnerConfig.Partitions is 0.
const DefaultPartitions = 16

// partitionDoc is a document of PartitionsCollection.
type partitionDoc struct {
	ID         string    `bson:"_id"`
	Projection string    `bson:"projection"`
	Partition  int       `bson:"partition"`
	Owner      string    `bson:"owner"`
	ExpiresAt  time.Time `bson:"expires_at"`
	AcquiredAt time.Time `bson:"acquired_at"`
	RenewedAt  time.Time `bson:"renewed_at"`
	Epoch      int64     `bson:"epoch"`
}

// memberDoc is a document of MembersCollection.
type memberDoc struct {
	ID         string          `bson:"_id"`
	Projection string          `bson:"projection"`
	Owner      string          `bson:"owner"`
	ExpiresAt  time.Time       `bson:"expires_at"`
	Partitions []partitionStat `bson:"partitions"` // what the member applied, by partition it holds
}

// partitionStat is what a member reports of a partition it holds.
type partitionStat struct {
	Partition int     `bson:"partition"`
	Applied   int64   `bson:"applied"` // events applied in this tenure
	Rate      float64 `bson:"rate"`    // events per second between the last two heartbeats
}

// partitionTable is one process's view of a projection's partition leases
// and members. Every claim is a conditional update filtered on the value
// it changes (claim-by-filter, invariant 6): {_id, expires_at < now} to
// take a free or expired partition, {_id, owner: this owner} to renew or
// release one, so of any number of claimants exactly one matches. Expiry
// uses the claimant's clock: clocks must agree to well within the TTL.
type partitionTable struct {
	parts, members *mongo.Collection
	projection     string
	owner          string
	ttl            time.Duration
	now            func() time.Time
}

func newPartitionTable(db *mongo.Database, projection, owner string, ttl time.Duration) *partitionTable {
	return &partitionTable{parts: db.Collection(PartitionsCollection), members: db.Collection(MembersCollection),
		projection: projection, owner: owner, ttl: ttl, now: time.Now}
}

func partitionID(projection string, p int) string { return fmt.Sprintf("%s/%02d", projection, p) }

// ensure creates the lease documents of partitions 0..n-1 that do not
// exist yet, free (expires_at at the epoch). A racing process's insert of
// the same document is a duplicate key, ignored.
func (t *partitionTable) ensure(ctx context.Context, n int) error {
	docs, err := t.list(ctx)
	if err != nil {
		return err
	}
	have := map[int]bool{}
	for _, d := range docs {
		have[d.Partition] = true
	}
	for p := range n {
		if have[p] {
			continue
		}
		_, err := t.parts.InsertOne(ctx, partitionDoc{ID: partitionID(t.projection, p), Projection: t.projection, Partition: p,
			ExpiresAt: time.Unix(0, 0).UTC()})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("create partition %s: %w", partitionID(t.projection, p), mongodb.Translate(err))
		}
	}
	return nil
}

// list returns the projection's partition leases in partition order (a
// filter on a small collection).
func (t *partitionTable) list(ctx context.Context) ([]partitionDoc, error) {
	docs, err := findOf[partitionDoc](ctx, t.parts, t.projection, "partitions")
	if err != nil {
		return nil, err
	}
	slices.SortFunc(docs, func(a, b partitionDoc) int { return a.Partition - b.Partition })
	return docs, nil
}

// heartbeat announces this process as a live member for one TTL, with
// what it applied in the partitions it holds.
func (t *partitionTable) heartbeat(ctx context.Context, stats []partitionStat) error {
	if stats == nil {
		stats = []partitionStat{}
	}
	_, err := t.members.UpdateOne(ctx, bson.D{{Key: "_id", Value: t.projection + "/" + t.owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "projection", Value: t.projection}, {Key: "owner", Value: t.owner},
			{Key: "expires_at", Value: t.now().UTC().Add(t.ttl)}, {Key: "partitions", Value: stats}}}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("heartbeat %s/%s: %w", t.projection, t.owner, mongodb.Translate(err))
	}
	return nil
}

// leave removes this process from the members at once.
func (t *partitionTable) leave(ctx context.Context) error {
	_, err := t.members.DeleteOne(ctx, bson.D{{Key: "_id", Value: t.projection + "/" + t.owner}})
	if err != nil {
		return fmt.Errorf("leave %s/%s: %w", t.projection, t.owner, mongodb.Translate(err))
	}
	return nil
}

// live returns the members whose heartbeat has not expired, sorted by
// owner, and deletes the documents of members gone for ten TTLs.
func (t *partitionTable) live(ctx context.Context) ([]memberDoc, error) {
	docs, err := findOf[memberDoc](ctx, t.members, t.projection, "members")
	if err != nil {
		return nil, err
	}
	now := t.now()
	var live []memberDoc
	for _, d := range docs {
		switch {
		case d.ExpiresAt.After(now):
			live = append(live, d)
		case now.Sub(d.ExpiresAt) > 10*t.ttl:
			_, _ = t.members.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.ID}, {Key: "expires_at", Value: d.ExpiresAt}})
		}
	}
	slices.SortFunc(live, func(a, b memberDoc) int { return strings.Compare(a.Owner, b.Owner) })
	return live, nil
}

// findOf decodes the documents of coll about projection; what names them
// in errors.
func findOf[T any](ctx context.Context, coll *mongo.Collection, projection, what string) ([]T, error) {
	cur, err := coll.Find(ctx, bson.D{{Key: "projection", Value: projection}})
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", what, projection, mongodb.Translate(err))
	}
	var docs []T
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("%s of %s: %w", what, projection, mongodb.Translate(err))
	}
	return docs, nil
}

// claim takes partition p at now (taken before the write is sent) if it
// is free, its lease has expired, or this owner holds it (a restart under
// the same instance id). It returns false, and no error, when another
// owner holds it or got it first.
func (t *partitionTable) claim(ctx context.Context, p int, now time.Time) (bool, error) {
	now = now.UTC()
	res, err := t.parts.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: partitionID(t.projection, p)}, {Key: "$or", Value: bson.A{
			bson.D{{Key: "expires_at", Value: bson.D{{Key: "$lt", Value: now}}}},
			bson.D{{Key: "owner", Value: t.owner}},
		}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: t.owner}, {Key: "expires_at", Value: now.Add(t.ttl)},
			{Key: "acquired_at", Value: now}, {Key: "renewed_at", Value: now}}},
			{Key: "$inc", Value: bson.D{{Key: "epoch", Value: int64(1)}}}})
	if err != nil {
		return false, fmt.Errorf("claim partition %s: %w", partitionID(t.projection, p), mongodb.Translate(err))
	}
	return res.MatchedCount == 1, nil
}

// renew extends this owner's leases of partitions ps from now (taken
// before the write is sent, so the local deadline is never later than the
// stored one), in one update. It returns the partitions still this
// owner's, renewed; the others passed to another owner.
func (t *partitionTable) renew(ctx context.Context, ps []int, now time.Time) ([]int, error) {
	ids := make(bson.A, len(ps))
	for i, p := range ps {
		ids[i] = partitionID(t.projection, p)
	}
	res, err := t.parts.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "owner", Value: t.owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: now.UTC().Add(t.ttl)}, {Key: "renewed_at", Value: now.UTC()}}}})
	if err != nil {
		return nil, fmt.Errorf("renew partitions of %s: %w", t.projection, mongodb.Translate(err))
	}
	if int(res.MatchedCount) == len(ps) {
		return ps, nil
	}
	// Some were lost: those still naming this owner were renewed.
	docs, err := t.list(ctx)
	if err != nil {
		return nil, err
	}
	var kept []int
	for _, d := range docs {
		if d.Owner == t.owner && slices.Contains(ps, d.Partition) {
			kept = append(kept, d.Partition)
		}
	}
	return kept, nil
}

// release frees partition p if this owner holds it, so a successor can
// claim it without waiting for the TTL. Call it only once this process
// has stopped writing p.
func (t *partitionTable) release(ctx context.Context, p int) error {
	_, err := t.parts.UpdateOne(ctx, bson.D{{Key: "_id", Value: partitionID(t.projection, p)}, {Key: "owner", Value: t.owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: ""}, {Key: "expires_at", Value: time.Unix(0, 0).UTC()}}}})
	if err != nil {
		return fmt.Errorf("release partition %s: %w", partitionID(t.projection, p), mongodb.Translate(err))
	}
	return nil
}

// fairShare is how many of n partitions the member at index i of m live
// members (sorted by owner) should hold: n/m, plus one for the first n%m
// members, so the shares add up to n and differ by at most one (the range
// assignment of Kafka's consumer groups).
func fairShare(n, m, i int) int {
	if m <= 0 {
		return n
	}
	s := n / m
	if i < n%m {
		s++
	}
	return s
}
