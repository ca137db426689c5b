package mongodb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/orderd/orderd/projector"
)

// MembersCollection holds one heartbeat document per projector process
// and projection: {_id: "<projection>/<owner>", projection, owner,
// expires_at, partitions: [{partition, applied, rate}]}. The live members
// (expires_at in the future) share the partitions; each reports what it
// applied in the partitions it holds.
const MembersCollection = "projection_members"

// memberDoc is a document of MembersCollection.
type memberDoc struct {
	ID         string      `bson:"_id"`
	Projection string      `bson:"projection"`
	Owner      string      `bson:"owner"`
	ExpiresAt  time.Time   `bson:"expires_at"`
	Partitions []reportDoc `bson:"partitions"` // what the member applied, by partition it holds
}

// reportDoc is a projector.PartitionReport as stored.
type reportDoc struct {
	Partition int     `bson:"partition"`
	Applied   int64   `bson:"applied"`
	Rate      float64 `bson:"rate"`
}

// Members is one process's entry among a projection's members: a
// heartbeat that says it is alive for one TTL, with what it applied.
type Members struct {
	coll       *mongo.Collection
	projection string
	owner      string
	ttl        time.Duration
	now        func() time.Time
}

// NewMembers returns owner's entry among projection's members in db's
// MembersCollection; a heartbeat lasts ttl.
func NewMembers(db *mongo.Database, projection, owner string, ttl time.Duration) *Members {
	return &Members{coll: db.Collection(MembersCollection), projection: projection, owner: owner, ttl: ttl, now: time.Now}
}

// Heartbeat announces this process as a live member for one TTL, with
// what it applied in the partitions it holds.
func (m *Members) Heartbeat(ctx context.Context, reports []projector.PartitionReport) error {
	docs := make([]reportDoc, len(reports))
	for i, r := range reports {
		docs[i] = reportDoc(r)
	}
	_, err := m.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: m.projection + "/" + m.owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "projection", Value: m.projection}, {Key: "owner", Value: m.owner},
			{Key: "expires_at", Value: m.now().UTC().Add(m.ttl)}, {Key: "partitions", Value: docs}}}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("heartbeat %s/%s: %w", m.projection, m.owner, Translate(err))
	}
	return nil
}

// Leave removes this process from the members at once.
func (m *Members) Leave(ctx context.Context) error {
	_, err := m.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: m.projection + "/" + m.owner}})
	if err != nil {
		return fmt.Errorf("leave %s/%s: %w", m.projection, m.owner, Translate(err))
	}
	return nil
}

// Live returns the members whose heartbeat has not expired, sorted by
// owner (a filter on a small collection), and deletes the documents of
// members gone for ten TTLs.
func (m *Members) Live(ctx context.Context) ([]projector.Member, error) {
	cur, err := m.coll.Find(ctx, bson.D{{Key: "projection", Value: m.projection}})
	if err != nil {
		return nil, fmt.Errorf("members of %s: %w", m.projection, Translate(err))
	}
	var docs []memberDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("members of %s: %w", m.projection, Translate(err))
	}
	now := m.now()
	var live []projector.Member
	for _, d := range docs {
		switch {
		case d.ExpiresAt.After(now):
			reports := make([]projector.PartitionReport, len(d.Partitions))
			for i, r := range d.Partitions {
				reports[i] = projector.PartitionReport(r)
			}
			live = append(live, projector.Member{Owner: d.Owner, ExpiresAt: d.ExpiresAt, Partitions: reports})
		case now.Sub(d.ExpiresAt) > 10*m.ttl:
			_, _ = m.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.ID}, {Key: "expires_at", Value: d.ExpiresAt}})
		}
	}
	slices.SortFunc(live, func(a, b projector.Member) int { return strings.Compare(a.Owner, b.Owner) })
	return live, nil
}
