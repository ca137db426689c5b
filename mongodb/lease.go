package mongodb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/lease"
	"github.com/orderd/orderd/outbox"
)

// LeasesCollection holds the named leases, one document per lease:
// {_id: name, owner, epoch, expires_at, acquired_at, renewed_at}.
const LeasesCollection = "leases"

// durably is the options of the lease and job collections: every write
// w:majority, j:true whatever the client's defaults (docs/guarantees.md),
// as a claim a failover can roll back would let two holders in, and the
// domain's types stored under their JSON names (jsonNames).
var durably = options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: new(true)}).SetBSONOptions(jsonNames)

// Leases is the one lease implementation: named, time-limited claims kept
// in one collection, one document per lease, each held by one holder at a
// time (invariant 6). The relay's lease (Lease) and the jobs' tasks
// (Jobs.Claim) are held through it.
//
// The times of the lease.Lease values it returns are the holder's clock
// with its monotonic reading, so a holder's fence does not move with the
// wall clock.
//
// Every write is one conditional update whose filter includes the value
// it changes (claim-by-filter): a claim matches only a lease that is free,
// expired, or already this holder's, and raises its epoch, the fencing
// token; a renewal, a release and a fenced write match only {_id, owner,
// epoch} of the claim that makes them. So of any number of claimants
// exactly one wins, and a deposed claim, also one deposed by a later
// claim of the same holder, has every write refused with
// domain.ErrLeaseLost. Expiry uses the holder's and the claimant's clocks:
// they must agree to well within the TTL. Writes are w:majority, j:true,
// whatever the client's defaults (durably).
//
// No transaction is used: each operation is one document write, which
// MongoDB applies atomically and which the embedded store's funnel runs
// alone.
type Leases struct {
	coll *mongo.Collection
	// expiry names the field holding a claim's deadline: "expires_at",
	// or "lease_until" in a job's task.
	expiry string
}

// newLeases returns the leases kept in collection of db, whose claims'
// deadlines are in the field expiry.
func newLeases(db *mongo.Database, collection, expiry string) *Leases {
	return &Leases{coll: db.Collection(collection, durably), expiry: expiry}
}

// Claim takes the lease name for holder for ttl if it is free, has
// expired, or is already holder's (a restart under the same id), raising
// its epoch; a lease without a document is created, at epoch 1. It returns
// the new claim and true, or false and no error when another holder has
// it (or got it first). It is one upsert: when another holder has the
// lease, its insert is refused by the unique _id.
func (l *Leases) Claim(ctx context.Context, name, holder string, ttl time.Duration) (lease.Lease, bool, error) {
	now := time.Now()
	free := bson.D{{Key: "$or", Value: append(l.expired(now), bson.D{{Key: "owner", Value: holder}})}}
	return l.claim(ctx, name, holder, ttl, now, free, nil, true)
}

// expired is the part of a claim's filter that matches a lease no one
// holds at now: one never held (no deadline), or expired.
func (l *Leases) expired(now time.Time) bson.A {
	return bson.A{
		bson.D{{Key: l.expiry, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: l.expiry, Value: bson.D{{Key: "$lt", Value: now}}}},
	}
}

// claim moves the lease document name, if it also matches cond, to a new
// claim of holder from now, in one findAndModify that raises its epoch and
// sets the fields of set besides the claim's; with upsert, a lease that
// has no document is created. It returns false and no error when nothing
// matched, or when the upsert's insert found the lease taken.
func (l *Leases) claim(ctx context.Context, name, holder string, ttl time.Duration, now time.Time, cond, set bson.D, upsert bool) (lease.Lease, bool, error) {
	filter := append(bson.D{{Key: "_id", Value: name}}, cond...)
	update := bson.D{
		{Key: "$set", Value: append(bson.D{{Key: "owner", Value: holder}, {Key: l.expiry, Value: now.Add(ttl)},
			{Key: "acquired_at", Value: now}, {Key: "renewed_at", Value: now}}, set...)},
		{Key: "$inc", Value: bson.D{{Key: "epoch", Value: int64(1)}}},
	}
	// The whole document comes back: lease documents are small, and the
	// embedded store refuses a findAndModify projection.
	opts := options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(upsert)
	raw, err := l.coll.FindOneAndUpdate(ctx, filter, update, opts).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) || mongo.IsDuplicateKeyError(err) {
		return lease.Lease{}, false, nil
	}
	if err != nil {
		return lease.Lease{}, false, fmt.Errorf("claim lease %s: %w", name, Translate(err))
	}
	epoch, ok := raw.Lookup("epoch").AsInt64OK()
	if !ok {
		return lease.Lease{}, false, fmt.Errorf("claim lease %s: epoch %s is not an integer", name, raw.Lookup("epoch"))
	}
	return lease.Lease{Name: name, Holder: holder, Epoch: epoch, AcquiredAt: now, RenewedAt: now, ExpiresAt: now.Add(ttl)}, true, nil
}

// Renew extends lease by ttl from now, in one update fenced by its epoch,
// and returns it renewed. A claim that expired is renewed while no other
// claim has followed it. Errors: domain.ErrLeaseLost when the lease has
// passed to another claim.
func (l *Leases) Renew(ctx context.Context, held lease.Lease, ttl time.Duration) (lease.Lease, error) {
	now := time.Now()
	if err := l.write(ctx, held, bson.D{{Key: l.expiry, Value: now.Add(ttl)}, {Key: "renewed_at", Value: now}}, "renew lease"); err != nil {
		return held, err
	}
	held.RenewedAt, held.ExpiresAt = now, now.Add(ttl)
	return held, nil
}

// Release gives lease up, so that another holder can claim it at once
// rather than after its TTL: its deadline moves to the Unix epoch. Call
// it only once the holder has stopped acting under the lease. Errors:
// domain.ErrLeaseLost when the lease has passed to another claim, so
// there was nothing of this holder's to release.
func (l *Leases) Release(ctx context.Context, held lease.Lease) error {
	return l.write(ctx, held, bson.D{{Key: l.expiry, Value: time.Unix(0, 0).UTC()}}, "release lease")
}

// write sets fields of lease's document in one update filtered on {_id,
// owner, epoch} of its claim, the fence of every write made under a
// lease: it matches only while that claim is the current one. what names
// the write in errors. Errors: domain.ErrLeaseLost when the claim is not
// the current one.
func (l *Leases) write(ctx context.Context, held lease.Lease, set bson.D, what string) error {
	fence := bson.D{{Key: "_id", Value: held.Name}, {Key: "owner", Value: held.Holder}, {Key: "epoch", Value: held.Epoch}}
	res, err := l.coll.UpdateOne(ctx, fence, bson.D{{Key: "$set", Value: set}})
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, held.Name, Translate(err))
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("%s %s at epoch %d: %w", what, held.Name, held.Epoch, domain.ErrLeaseLost)
	}
	return nil
}

// Get returns the lease name as stored: its last holder, epoch and
// deadline (a free lease has a deadline in the past). Errors:
// domain.ErrNotFound when it has no document.
func (l *Leases) Get(ctx context.Context, name string) (lease.Lease, error) {
	raw, err := l.find(ctx, name)
	if err == nil && raw == nil {
		err = fmt.Errorf("lease %s: %w", name, domain.ErrNotFound)
	}
	if err != nil {
		return lease.Lease{}, err
	}
	return l.decode(raw), nil
}

// find reads the document of lease name, with whatever its holder keeps
// beside the lease; nil when it has none.
func (l *Leases) find(ctx context.Context, name string) (bson.Raw, error) {
	raw, _, err := findOne[bson.Raw](ctx, l.coll, bson.D{{Key: "_id", Value: name}})
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", name, err)
	}
	return raw, nil
}

// decode reads a lease document; a field it lacks stays zero.
func (l *Leases) decode(d bson.Raw) lease.Lease {
	var out lease.Lease
	out.Name, _ = d.Lookup("_id").StringValueOK()
	out.Holder, _ = d.Lookup("owner").StringValueOK()
	out.Epoch, _ = d.Lookup("epoch").AsInt64OK()
	out.AcquiredAt, _ = d.Lookup("acquired_at").TimeOK()
	out.RenewedAt, _ = d.Lookup("renewed_at").TimeOK()
	out.ExpiresAt, _ = d.Lookup(l.expiry).TimeOK()
	return out
}

// Lease is one holder's hold on one named lease of LeasesCollection, for
// a loop that claims it and keeps it (the relay), with the checkpoint the
// holder keeps beside it: it remembers
// the claim it holds, so its renewals and its release are fenced by that
// claim's epoch. It is safe for concurrent use.
type Lease struct {
	leases *Leases
	name   string
	holder string
	ttl    time.Duration

	mu        sync.Mutex
	held      *lease.Lease // the claim last made or renewed; nil when none
	uncertain bool         // the last claim failed: it may have landed
}

// NewLease returns the lease named name of db's LeasesCollection, for
// holder (an instance id); ttl is how long a claim or renewal lasts.
func NewLease(db *mongo.Database, name, holder string, ttl time.Duration) *Lease {
	return &Lease{leases: newLeases(db, LeasesCollection, "expires_at"), name: name, holder: holder, ttl: ttl}
}

// TryAcquire renews the claim this Lease holds or, when it holds none or
// has lost it, claims the lease (see Leases.Claim). It reports whether
// this holder holds the lease now; false and no error when another holder
// does. After an error the claim is kept: the next call renews it if no
// other holder claimed it meanwhile.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held != nil {
		renewed, err := l.leases.Renew(ctx, *l.held, l.ttl)
		if err == nil {
			l.held = &renewed
			return true, nil
		}
		if !errors.Is(err, domain.ErrLeaseLost) {
			return false, err
		}
		l.held = nil
	}
	claimed, ok, err := l.leases.Claim(ctx, l.name, l.holder, l.ttl)
	l.uncertain = err != nil
	if !ok {
		return false, err
	}
	l.held = &claimed
	return true, nil
}

// Release gives the lease up if this holder holds it, so another instance
// can claim it at once; releasing a lease it does not hold changes nothing
// and returns nil. After a claim that failed, which may have landed, it
// reads the lease and releases it if it is this holder's.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.held
	if held == nil && l.uncertain {
		stored, err := l.leases.Get(ctx, l.name)
		if err != nil && !errors.Is(err, domain.ErrNotFound) {
			return err
		}
		if err == nil && stored.Holder == l.holder {
			held = &stored
		}
	}
	if held == nil {
		l.uncertain = false
		return nil
	}
	err := l.leases.Release(ctx, *held)
	if err != nil && !errors.Is(err, domain.ErrLeaseLost) {
		return err
	}
	l.held, l.uncertain = nil, false
	return nil
}

// Held returns the claim this Lease holds, and false when it holds none.
func (l *Lease) Held() (lease.Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		return lease.Lease{}, false
	}
	return *l.held, true
}

// Checkpoint returns the relay's checkpoint (outbox.Checkpoint) as last
// saved under this lease by any holder: the position (a resume token of
// the log's change stream, as a BSON document), the recorded time of the
// last commit it covers, and the log position and stream sequence of the
// last event published; its Token is nil when none was saved (and its
// log position 0 when an earlier version saved one without). Errors:
// domain.ErrUnavailable.
func (l *Lease) Checkpoint(ctx context.Context) (outbox.Checkpoint, error) {
	var out outbox.Checkpoint
	raw, err := l.leases.find(ctx, l.name)
	if err != nil {
		return out, err
	}
	cp, ok := raw.Lookup("checkpoint").DocumentOK()
	if !ok {
		return out, nil
	}
	p, ok := cp.Lookup("position").DocumentOK()
	if !ok {
		return out, fmt.Errorf("read checkpoint %s: no position in %s", l.name, cp)
	}
	out.Token = slices.Clone([]byte(p))
	out.RecordedAt, _ = cp.Lookup("recorded_at").TimeOK()
	position, _ := cp.Lookup("log_position").AsInt64OK() // 0 when missing
	seq, _ := cp.Lookup("seq").AsInt64OK()
	out.Position, out.Seq = uint64(position), uint64(seq)
	return out, nil
}

// Published returns the log position and stream sequence of the last
// event the relay's checkpoint covers (projection.Positions): where a
// rollup's build starts its shadow. Errors: domain.ErrUnavailable.
func (l *Lease) Published(ctx context.Context) (position, seq uint64, err error) {
	cp, err := l.Checkpoint(ctx)
	return cp.Position, cp.Seq, err
}

// SaveCheckpoint stores cp as the lease's checkpoint, in one update fenced
// by the claim this Lease holds: a holder deposed by another claim can
// move the checkpoint neither back nor forward. Errors:
// domain.ErrLeaseLost when this Lease holds no claim or its claim has
// passed to another; domain.ErrUnavailable.
func (l *Lease) SaveCheckpoint(ctx context.Context, cp outbox.Checkpoint) error {
	held, ok := l.Held()
	if !ok {
		return fmt.Errorf("save checkpoint %s: %w", l.name, domain.ErrLeaseLost)
	}
	return l.leases.write(ctx, held, bson.D{{Key: "checkpoint", Value: bson.D{{Key: "position", Value: bson.Raw(cp.Token)},
		{Key: "recorded_at", Value: cp.RecordedAt}, {Key: "log_position", Value: int64(cp.Position)}, {Key: "seq", Value: int64(cp.Seq)},
		{Key: "saved_at", Value: time.Now()}}}}, "save checkpoint")
}

// Status returns the lease's holder and deadline and its checkpoint's
// times, as stored (outbox.RelayStatus); zero when the lease has no
// document. Errors: domain.ErrUnavailable.
func (l *Lease) Status(ctx context.Context) (outbox.RelayStatus, error) {
	raw, err := l.leases.find(ctx, l.name)
	if err != nil || raw == nil {
		return outbox.RelayStatus{}, err
	}
	stored := l.leases.decode(raw)
	st := outbox.RelayStatus{Owner: stored.Holder, Epoch: stored.Epoch, LeaseUntil: stored.ExpiresAt.UTC()}
	st.CheckpointRecordedAt, _ = raw.Lookup("checkpoint", "recorded_at").TimeOK()
	st.CheckpointSavedAt, _ = raw.Lookup("checkpoint", "saved_at").TimeOK()
	return st, nil
}
