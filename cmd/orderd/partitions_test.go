package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/projection"
	"github.com/orderd/orderd/projector"
)

// pinnedTTL is how long JetStream keeps a partition pinned to a projector
// of TestChaos_PartitionTakeover that stopped pulling.
const pinnedTTL = 5 * time.Second

// TestChaos_PartitionTakeover runs one API (with the relay), one jobs
// process and three projector processes sharing the projection's 16
// partitions, under load. It SIGKILLs one projector: JetStream unpins its
// partitions once it has sent no pull for the pinned TTL, and the others,
// below their new share, are given them; then a fourth joins and gets its
// share. Every event is applied exactly as the log says (the three checks
// of guarantees, verify at drift 0).
func TestChaos_PartitionTakeover(t *testing.T) {
	chaosParallel(t)
	loadFor := 20 * time.Second
	if *chaosLong {
		loadFor = 60 * time.Second
	}
	c := newCluster(t)
	api := c.add("api", "api,relay")
	c.add("jobs", "jobs")
	startProjector := func(name string) *proc {
		return c.add(name, "projector", "-partition-pinned-ttl", pinnedTTL.String())
	}
	name := projection.OrderSummaries.Name
	ctx := t.Context()
	cl, err := orderhttp.NewClient(orderhttp.ClientConfig{URL: api.url()})
	if err != nil {
		t.Fatal(err)
	}
	probes := 0
	// waitShares waits until the owners hold the projection's partitions
	// between them, each its even share (16 over n: 5 or 6), and returns
	// what each applied in them.
	waitShares := func(what string, owners ...*proc) map[string]held {
		t.Helper()
		var got map[string]held
		if !waitFor(2*time.Minute, 200*time.Millisecond, func() bool {
			// A partition is pinned once a message reaches it: probe
			// orders reach every partition, also once the load is over.
			for range 4 {
				probes++
				if _, err := cl.Execute(ctx, fmt.Sprintf("probe-%04d", probes), domain.PlaceOrder{CustomerID: "cust-probe",
					Currency: "BRL", Items: []domain.Line{{SKU: "probe", Quantity: 1, UnitPriceCents: 100}}}, domain.ExecOptions{}); err != nil {
					t.Logf("probe order: %v", err)
				}
			}
			got = c.partitionOwners(ctx)[name]
			total := 0
			for _, o := range owners {
				n := got[o.name].partitions
				total += n
				if n < projector.DefaultPartitions/len(owners) || n > (projector.DefaultPartitions+len(owners)-1)/len(owners) {
					return false
				}
			}
			return total == projector.DefaultPartitions && len(got) == len(owners)
		}) {
			t.Fatalf("%s: partitions held as %v, want an even share each for %d owners", what, got, len(owners))
		}
		t.Logf("%s: partitions held as %v", what, got)
		return got
	}
	p1, p2, p3 := startProjector("projector-1"), startProjector("projector-2"), startProjector("projector-3")

	wait, done := runLoad(t, loadgen.Config{URLs: []string{api.url()}, Orders: 100_000, Duration: loadFor,
		Concurrency: 6, ConflictRate: 0.05, Seed: 11, RunID: "takeover", RetryFor: time.Minute})
	waitShares("three projectors", p1, p2, p3)
	// Kill p2 once it has applied events of its own partitions.
	if !waitFor(time.Minute, 200*time.Millisecond, func() bool {
		return c.partitionOwners(ctx)[name][p2.name].applied > 0
	}) {
		t.Fatalf("%s applied nothing within a minute of load", p2.name)
	}
	p2.in.kill()
	killedAt := time.Now()
	waitShares("after "+p2.name+" was killed", p1, p3)
	t.Logf("partitions of the killed %s taken over %v after the kill (pinned TTL %v)",
		p2.name, time.Since(killedAt).Round(100*time.Millisecond), pinnedTTL)

	p4 := startProjector("projector-4")
	waitShares("after "+p4.name+" joined", p1, p3, p4)

	select {
	case <-done:
		t.Logf("the load ended before %s had its share: the join was not under load", p4.name)
	default:
	}
	rep := wait()
	f := c.guarantees(api, "takeover-", rep.Acks, rep.Unknown, nil)
	t.Logf("GUARANTEES partition takeover: %d commands acknowledged, %d events, drift %d", f.Acked, f.Events, f.Drift)
}
