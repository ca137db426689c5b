package main

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/internal/projectiontest"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/projection"
)

// TestDailySalesVerifyFindsAndRepairsDrift: the daily sales rollup is
// verified by building it again from the log and comparing the two. A
// day's sums changed behind the projector's back are reported as drift,
// naming the day, the currency and the field; a verify without repair
// changes nothing readers see; with repair, readers are switched to the
// collection built from the log, and a verify after it finds no drift.
func TestDailySalesVerifyFindsAndRepairsDrift(t *testing.T) {
	const token = "test-admin-token"
	a := runMainDir(t, t.TempDir(), func(c *Config) {
		c.HTTP.AdminToken = token
		c.Jobs.Settle = 200 * time.Millisecond
		c.Jobs.Grace = time.Second
		// The build's cut and scan wait this margin each.
		c.Relay.CatchUpMargin = time.Second
	})
	ctx := t.Context()
	db := a.mongo.Database(a.Config.Mongo.Database)
	c := newClient(t, a)
	auth := []string{"Authorization", "Bearer " + token}

	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("drift-%02d", i)
		currency := []string{"EUR", "BRL"}[i%2]
		c.must(http.StatusCreated, "POST", "/v1/orders", fmt.Sprintf(
			`{"order_id":%q,"customer_id":"drift-customer","currency":%q,"items":[{"sku":"s","quantity":%d,"unit_price_cents":990}]}`,
			id, currency, 1+i%3))
		if i%3 == 2 {
			c.must(http.StatusOK, "POST", "/v1/orders/"+id+"/cancel", `{"reason":"drift test"}`)
		}
		ids = append(ids, id)
	}
	f := projectiontest.LoadFixture(t, ctx, mongodb.NewEventStore(db), ids)
	want, first, last := f.ExpectedDailySales()
	salesPath := fmt.Sprintf("/v1/daily-sales?from=%s&to=%s", first, last)
	sales := projection.DailySales
	active := func() projection.Pointer {
		t.Helper()
		var p projection.Pointer
		if err := db.Collection(mongodb.PointersCollection).FindOne(ctx, bson.D{{Key: "_id", Value: sales.Name}}).Decode(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var diff error
	if !waitFor(time.Minute, 50*time.Millisecond, func() bool {
		diff = projectiontest.DiffReadModels(ctx, db, f)
		return diff == nil && active().Active != ""
	}) {
		t.Fatalf("the read models never equal the fold of the log: %v", diff)
	}
	before := active()

	// One day's gross in euros, changed in the active collection with the
	// year's own compare-and-set, as a bug or a hand edit would.
	rollups := mongodb.NewRollups(db)
	yearID := projection.YearID(first, "EUR")
	y, ok, err := rollups.LoadYear(ctx, before.Active, yearID)
	if err != nil || !ok {
		t.Fatalf("load %s from %s: %v, found %v", yearID, before.Active, err, ok)
	}
	d := y.Days[first]
	d.GrossCents += 100_000
	y.Days[first] = d
	y.Rev++
	if saved, err := rollups.SaveYear(ctx, before.Active, y); err != nil || !saved {
		t.Fatalf("save the changed year: %v, saved %v", err, saved)
	}
	tampered := string(c.must(http.StatusOK, "GET", salesPath, "").Body)

	verify := func(repair bool) jobs.Job {
		t.Helper()
		var job jobs.Job
		c.must(http.StatusAccepted, "POST", "/v1/admin/projections/"+sales.Name+"/verifications",
			fmt.Sprintf(`{"repair":%v}`, repair), auth...).decode(t, &job)
		if !waitFor(2*time.Minute, 100*time.Millisecond, func() bool {
			c.must(http.StatusOK, "GET", "/v1/admin/projections/"+sales.Name+"/verifications/"+job.ID, "", auth...).decode(t, &job)
			return job.State.Final()
		}) {
			t.Fatalf("verify (repair %v) did not finish: %+v", repair, job)
		}
		if job.State != jobs.StateSucceeded || job.Report == nil {
			t.Fatalf("verify (repair %v): %s %s", repair, job.State, job.Error)
		}
		return job
	}

	// Reported, and nothing changed.
	job := verify(false)
	rep := job.Report
	if rep.Different != 1 || rep.Missing != 0 || rep.Extra != 0 || rep.Repaired != 0 || rep.Digest == rep.ExpectedDigest ||
		len(rep.Examples) != 1 || rep.Examples[0].ID != first+"|EUR" || rep.Examples[0].Kind != "different" {
		t.Fatalf("verify without repair reports %+v; want one day different: %s|EUR", rep, first)
	}
	if after := active(); after.Active != before.Active || after.Shadow != "" || after.Previous != before.Previous {
		t.Fatalf("a verify without repair switched readers or left its shadow: %+v, was %+v", after, before)
	}
	if got := string(c.must(http.StatusOK, "GET", salesPath, "").Body); got != tampered {
		t.Fatalf("a verify without repair changed the answer:\n got %s\nwant %s", got, tampered)
	}

	// Repaired: readers switched to the collection built from the log.
	job = verify(true)
	if rep := job.Report; rep.Different != 1 || rep.Repaired != 1 {
		t.Fatalf("verify with repair reports %+v; want one day different and repaired", rep)
	}
	if after := active(); after.Active == before.Active || after.Previous != before.Active {
		t.Fatalf("after the repair the pointer is %+v; want a new active collection replacing %s", after, before.Active)
	}
	var got struct {
		Days []domain.DailySales `json:"days"`
	}
	c.must(http.StatusOK, "GET", salesPath, "").decode(t, &got)
	if !reflect.DeepEqual(got.Days, want) {
		t.Fatalf("after the repair the daily sales are\n%+v\nwant\n%+v", got.Days, want)
	}
	if err := projectiontest.DiffReadModels(ctx, db, f); err != nil {
		t.Fatal(err)
	}
	if rep := verify(false).Report; rep.Drift() != 0 || rep.Digest != rep.ExpectedDigest {
		t.Fatalf("a verify after the repair reports %+v", rep)
	}
}
