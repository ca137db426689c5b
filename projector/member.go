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

// MembersCollection holds one heartbeat document per projector process
// and projection: {_id: "<projection>/<owner>", projection, owner,
// expires_at, partitions: [{partition, applied, rate}]}. The live members
// (expires_at in the future) share the partitions; each reports what it
// applied in the partitions it holds.
const MembersCollection = "projection_members"

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

// memberTable is one process's entry among a projection's members: a
// heartbeat that says it is alive, and what it applied.
type memberTable struct {
	members    *mongo.Collection
	projection string
	owner      string
	ttl        time.Duration
	now        func() time.Time
}

func newMemberTable(db *mongo.Database, projection, owner string, ttl time.Duration) *memberTable {
	return &memberTable{members: db.Collection(MembersCollection), projection: projection, owner: owner, ttl: ttl, now: time.Now}
}

// heartbeat announces this process as a live member for one TTL, with
// what it applied in the partitions it holds.
func (t *memberTable) heartbeat(ctx context.Context, stats []partitionStat) error {
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
func (t *memberTable) leave(ctx context.Context) error {
	_, err := t.members.DeleteOne(ctx, bson.D{{Key: "_id", Value: t.projection + "/" + t.owner}})
	if err != nil {
		return fmt.Errorf("leave %s/%s: %w", t.projection, t.owner, mongodb.Translate(err))
	}
	return nil
}

// live returns the members whose heartbeat has not expired, sorted by
// owner, and deletes the documents of members gone for ten TTLs.
func (t *memberTable) live(ctx context.Context) ([]memberDoc, error) {
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
