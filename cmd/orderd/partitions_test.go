package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// partitionTTL is the partition lease of the projectors of
// TestChaos_PartitionTakeover.
const partitionTTL = 5 * time.Second

// ownership is one owner's hold on one partition, as its ownership log
// says: from a start line to the next stop line of the same partition, or,
// with no stop, to the owner's death (a SIGKILL) or for ever (still
// running).
type ownership struct {
	Owner, Projection string
	Partition         int
	Start, Stop       time.Time // Stop zero: never stopped
}

// readOwnerships reads the ownership logs of the owners in files (owner:
// path); an owner in killed has its open ownerships end at its kill time,
// the moment after which it wrote nothing.
func readOwnerships(t *testing.T, files map[string]string, killed map[string]time.Time) []ownership {
	t.Helper()
	var out []ownership
	for owner, path := range files {
		f, err := os.Open(path)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		open := map[string]int{} // projection/partition: index in out
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r ownershipRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("%s: %q: %v", path, sc.Text(), err)
			}
			if r.Owner != owner {
				t.Fatalf("%s: a line of owner %s", path, r.Owner)
			}
			key := fmt.Sprintf("%s/%d", r.Projection, r.Partition)
			i, isOpen := open[key]
			switch {
			case r.Event == "start" && isOpen:
				t.Errorf("%s: %s starts %s twice without a stop", path, owner, key)
			case r.Event == "start":
				open[key] = len(out)
				out = append(out, ownership{Owner: owner, Projection: r.Projection, Partition: r.Partition, Start: r.At})
			case r.Event == "stop" && isOpen:
				out[i].Stop = r.At
				delete(open, key)
			default:
				t.Errorf("%s: %s stops %s, which it had not started", path, owner, key)
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if at, ok := killed[owner]; ok {
			for _, i := range open {
				out[i].Stop = at
			}
		}
	}
	return out
}

// overlaps returns, for each partition, every pair of consecutive
// ownerships (by start) of which the later started before the earlier had
// stopped: two writers at once.
func overlaps(ownerships []ownership) []string {
	byPart := map[string][]ownership{}
	for _, tn := range ownerships {
		key := fmt.Sprintf("%s/%02d", tn.Projection, tn.Partition)
		byPart[key] = append(byPart[key], tn)
	}
	var out []string
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range byPart {
			if !yield(k) {
				return
			}
		}
	}) {
		ts := byPart[key]
		slices.SortFunc(ts, func(a, b ownership) int { return a.Start.Compare(b.Start) })
		for i := 1; i < len(ts); i++ {
			prev, cur := ts[i-1], ts[i]
			if prev.Stop.IsZero() || cur.Start.Before(prev.Stop) {
				stop := "never stopped"
				if !prev.Stop.IsZero() {
					stop = "stopped " + prev.Stop.Format(time.RFC3339Nano)
				}
				out = append(out, fmt.Sprintf("%s: %s started %s while %s (started %s) had %s",
					key, cur.Owner, cur.Start.Format(time.RFC3339Nano), prev.Owner, prev.Start.Format(time.RFC3339Nano), stop))
			}
		}
	}
	return out
}

// TestOwnershipOverlapCheck: the check of TestChaos_PartitionTakeover
// finds two writers of a partition at once, whether the first one stopped
// too late or never stopped, and accepts ownerships that follow each
// other.
func TestOwnershipOverlapCheck(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 0, 0, s, 0, time.UTC) }
	clean := []ownership{
		{Owner: "a", Projection: "p", Partition: 1, Start: at(0), Stop: at(10)},
		{Owner: "b", Projection: "p", Partition: 1, Start: at(10), Stop: at(20)},
		{Owner: "a", Projection: "p", Partition: 1, Start: at(25)},
		{Owner: "b", Projection: "p", Partition: 2, Start: at(5)},
		{Owner: "b", Projection: "q", Partition: 1, Start: at(5)},
	}
	if got := overlaps(clean); len(got) != 0 {
		t.Errorf("ownerships that follow each other: %v", got)
	}
	late := append(slices.Clone(clean), ownership{Owner: "c", Projection: "p", Partition: 1, Start: at(19), Stop: at(24)})
	if got := overlaps(late); len(got) != 1 || !strings.Contains(got[0], "c started") {
		t.Errorf("a start before the previous owner's stop: %v, want one overlap", got)
	}
	never := append(slices.Clone(clean), ownership{Owner: "c", Projection: "p", Partition: 2, Start: at(30)})
	if got := overlaps(never); len(got) != 1 || !strings.Contains(got[0], "never stopped") {
		t.Errorf("a start while the previous owner never stopped: %v, want one overlap", got)
	}
}

// TestChaos_PartitionTakeover runs an API with the relay, a job runner
// and three projector processes sharing the projection's 16 partitions,
// under load. It SIGKILLs one projector: the others take over its
// partitions once its leases expire; then a fourth joins and gets its
// share. Every event is applied (the three checks of guarantees, verify
// at drift 0), and the ownership logs show that no partition was ever
// written by two processes at once.
func TestChaos_PartitionTakeover(t *testing.T) {
	chaosParallel(t)
	loadFor := 20 * time.Second
	if *chaosLong {
		loadFor = 60 * time.Second
	}
	c := newCluster(t)
	api := c.add("api", "api,relay")
	c.add("jobs", "jobs")
	logs := map[string]string{}
	startProjector := func(name string) *proc {
		logs[name] = filepath.Join(c.dir, "ownership-"+name+".jsonl")
		return c.add(name, "projector", "-ownership-log", logs[name], "-partition-lease-ttl", partitionTTL.String())
	}
	names := []string{projection.OrderSummaries.Key()}
	ctx := t.Context()
	// waitShares waits until, in the projection, the owners hold the
	// partitions between them, each its even share (16 over n: 5 or 6).
	waitShares := func(what string, owners ...string) {
		t.Helper()
		var got map[string]map[string]int
		if !waitFor(2*time.Minute, 200*time.Millisecond, func() bool {
			got = c.partitionOwners(ctx)
			ok := got != nil
			for _, name := range names {
				total := 0
				for o, n := range got[name] {
					total += n
					if !slices.Contains(owners, o) || n < projector.DefaultPartitions/len(owners) ||
						n > (projector.DefaultPartitions+len(owners)-1)/len(owners) {
						ok = false
					}
				}
				ok = ok && total == projector.DefaultPartitions && len(got[name]) == len(owners)
			}
			return ok
		}) {
			t.Fatalf("%s: partitions held as %v, want an even share each for %v", what, got, owners)
		}
		t.Logf("%s: partitions held as %v", what, got)
	}
	p1, p2, p3 := startProjector("projector-1"), startProjector("projector-2"), startProjector("projector-3")
	waitShares("three projectors", p1.name, p2.name, p3.name)

	wait, done := runLoad(t, loadgen.Config{URLs: []string{api.url()}, Orders: 100_000, Duration: loadFor,
		Concurrency: 6, ConflictRate: 0.05, Seed: 11, RunID: "takeover", RetryFor: time.Minute})
	// Kill p2 once it has applied events of its own partitions.
	if !waitFor(time.Minute, 200*time.Millisecond, func() bool {
		tns := readOwnerships(t, map[string]string{p2.name: logs[p2.name]}, nil)
		applied := c.appliedBy(ctx, p2.name)
		if len(tns) > 0 && applied > 0 {
			t.Logf("%s has started %d ownerships and applied %d events", p2.name, len(tns), applied)
			return true
		}
		return false
	}) {
		t.Fatalf("%s applied nothing within a minute of load", p2.name)
	}
	p2.in.kill()
	killedAt := time.Now()
	waitShares("after "+p2.name+" was killed", p1.name, p3.name)
	t.Logf("partitions of the killed %s taken over %v after the kill (partition lease %v)",
		p2.name, time.Since(killedAt).Round(100*time.Millisecond), partitionTTL)

	p4 := startProjector("projector-4")
	waitShares("after "+p4.name+" joined", p1.name, p3.name, p4.name)

	select {
	case <-done:
		t.Logf("the load ended before %s had its share: the join was not under load", p4.name)
	default:
	}
	rep := wait()
	f := c.guarantees(api, "takeover-", rep.Acks, rep.Unknown, nil)

	ownerships := readOwnerships(t, logs, map[string]time.Time{p2.name: killedAt})
	byOwner := map[string]int{}
	for _, tn := range ownerships {
		byOwner[tn.Owner]++
	}
	for _, p := range []*proc{p1, p2, p3, p4} {
		if byOwner[p.name] == 0 {
			t.Errorf("%s logged no ownership", p.name)
		}
	}
	if o := overlaps(ownerships); len(o) > 0 {
		t.Fatalf("%d times a partition had two writers at once:\n%s", len(o), strings.Join(o, "\n"))
	}
	t.Logf("GUARANTEES partition takeover: %d commands acknowledged, %d events, drift %d; %d ownerships over %d partitions (by owner %v), none overlapping",
		f.Acked, f.Events, f.Drift, len(ownerships), projector.DefaultPartitions, byOwner)
}

// appliedBy is how many events owner reported applying in its current
// ownerships (its member heartbeats).
func (c *cluster) appliedBy(ctx context.Context, owner string) int64 {
	var members []struct {
		Owner      string `bson:"owner"`
		Partitions []struct {
			Applied int64 `bson:"applied"`
		} `bson:"partitions"`
	}
	cur, err := c.mongo.Database(chaosDatabase).Collection(mongodb.MembersCollection).Find(ctx, bson.D{{Key: "owner", Value: owner}})
	if err != nil || cur.All(ctx, &members) != nil {
		return 0
	}
	var n int64
	for _, m := range members {
		for _, p := range m.Partitions {
			n += p.Applied
		}
	}
	return n
}
