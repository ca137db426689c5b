package eventstore

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	mongoerr "github.com/orderd/orderd/mongodb"
)

// LeasesCollection holds one document per lease: {_id: name, owner,
// expires_at, acquired_at}.
const LeasesCollection = "leases"

// Lease is a named, time-limited claim held by one owner among many
// instances (invariant 6). It is renewed by an update filtered on this
// owner, and otherwise claimed by a conditional upsert whose filter
// matches only an expired claim: when another owner holds it, the filter
// matches nothing and the upsert's insert collides on _id (E11000), and
// the claim is lost. Expiry uses the claimant's clock, so
// clocks must agree to well within the TTL.
type Lease struct {
	coll  *mongo.Collection
	name  string
	owner string
	ttl   time.Duration
	now   func() time.Time
}

// NewLease returns a lease named name for owner (an instance id) on db's
// "leases" collection. ttl is how long a claim lasts without renewal.
func NewLease(db *mongo.Database, name, owner string, ttl time.Duration) *Lease {
	return &Lease{coll: db.Collection(LeasesCollection), name: name, owner: owner, ttl: ttl, now: time.Now}
}

// TryAcquire claims or renews the lease. It returns true while this owner
// holds it and false when another owner does. A renewal is an update
// filtered on {_id, owner}; a claim is an upsert filtered on {_id,
// expires_at < now}, which matches only an expired (or released) claim, so
// of any number of claimants exactly one wins: the others' filters match
// nothing once the winner's write is in, and their inserts collide on _id.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	now := l.now().UTC()
	set := bson.D{{Key: "$set", Value: bson.D{
		{Key: "owner", Value: l.owner}, {Key: "expires_at", Value: now.Add(l.ttl)}, {Key: "renewed_at", Value: now},
	}}}
	res, err := l.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "owner", Value: l.owner}}, set)
	if err != nil {
		return false, fmt.Errorf("renew lease %s: %w", l.name, mongoerr.Translate(err))
	}
	if res.MatchedCount == 1 {
		return true, nil
	}
	expired := bson.D{{Key: "_id", Value: l.name}, {Key: "expires_at", Value: bson.D{{Key: "$lt", Value: now}}}}
	_, err = l.coll.UpdateOne(ctx, expired, set, options.UpdateOne().SetUpsert(true))
	if isDuplicate(err) {
		return false, nil // another owner holds it
	}
	if err != nil {
		return false, fmt.Errorf("claim lease %s: %w", l.name, mongoerr.Translate(err))
	}
	return true, nil
}

// Release gives the lease up if this owner holds it, so another instance
// can take over without waiting for the TTL.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: l.name}, {Key: "owner", Value: l.owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: time.Unix(0, 0).UTC()}}}})
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.name, mongoerr.Translate(err))
	}
	return nil
}

func isDuplicate(err error) bool { return err != nil && mongo.IsDuplicateKeyError(err) }
