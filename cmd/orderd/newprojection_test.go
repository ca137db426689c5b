package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/jobs"
	"github.com/orderd/orderd/mongodb"
	"github.com/orderd/orderd/mongodb/storetest"
	"github.com/orderd/orderd/projection"
)

// TestReadModelBuiltOnAServiceWithALog deploys the read model,
// order_summaries, onto a service whose log already holds Olist orders:
// the store is made to look as before the projection existed (no
// collection, pointer, partitions, members or consumers of it), and a new
// start builds it from the log before the read routes answer. Until then
// they say so (503 read-model-building); every answer they give is the
// complete one; the replay's check of every order and of the daily sales
// passes.
func TestReadModelBuiltOnAServiceWithALog(t *testing.T) {
	storeURI := storetest.MongoURI(t)
	db := storetest.Database(t)
	n := storetest.StartNATS(t) // before the instances: its cleanup runs after they closed
	const token = "summaries-admin-token"
	start := func(id string) *Main {
		t.Helper()
		return runMainDir(t, t.TempDir(), func(c *Config) {
			c.Mongo.URI, c.Mongo.Database, c.NATS.URL, c.InstanceID = storeURI, db.Name(), n.URL, id
			c.HTTP.AdminToken = token
			c.Jobs.Settle = 200 * time.Millisecond
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	limit := replayLimit()
	cfg := olist.Config{Data: "../../testdata/olist-sample", Concurrency: 8, Limit: limit, Timeout: 30 * time.Second}

	a := start("summaries-before")
	cfg.URL = "http://" + a.HTTPAddr
	if rep, err := olist.Run(ctx, cfg); err != nil || rep.Err() != nil {
		t.Fatalf("import: %v %v", err, rep.Err())
	}
	stream := a.Config.Stream.Name
	closeMain(t, a)

	// The store and the stream as a service without order_summaries left
	// them: every collection of it (the base name and the rebuilt ones the
	// pointer names, all prefixed with the base name), its pointer, and
	// the consumers of its version.
	def := projection.OrderSummaries
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if name == def.Collection || strings.HasPrefix(name, def.Collection+"_") {
			if err := db.Collection(name).Drop(ctx); err != nil {
				t.Fatalf("drop %s: %v", name, err)
			}
		}
	}
	if _, err := db.Collection(mongodb.PointersCollection).DeleteMany(ctx, bson.D{{Key: "_id", Value: def.Name}}); err != nil {
		t.Fatal(err)
	}
	for p := range a.Config.Projector.Partitions {
		name := fmt.Sprintf("proj_%s_p%02d", def.Key(), p)
		if err := n.JS.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatalf("delete consumer %s: %v", name, err)
		}
	}

	b := start("summaries-after")
	c := newClient(t, b)
	// Ask from the start: not built yet, or the whole answer. Every read
	// route reads order_summaries; the daily sales sum it over a range
	// that holds the oldest orders of the sample, those imported.
	var (
		mu      sync.Mutex
		answers = map[int]int{}
		bodies  []string
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	const path = "/v1/daily-sales?from=2016-09-01&to=2017-08-31"
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := c.do("GET", path, "")
			mu.Lock()
			answers[r.Status]++
			switch r.Status {
			case http.StatusOK:
				bodies = append(bodies, string(r.Body))
			case http.StatusServiceUnavailable:
				if !strings.Contains(string(r.Body), "/problems/read-model-building") || r.Header.Get("Retry-After") == "" {
					t.Errorf("503 before the build: %v, Retry-After %q; want /problems/read-model-building", r, r.Header.Get("Retry-After"))
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	})
	cfg.URL, cfg.CheckOnly = "http://"+b.HTTPAddr, true
	rep, err := olist.Run(ctx, cfg)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	_ = rep.Print(&out)
	t.Logf("check after the deploy:\n%s", out.String())
	if rep.Err() != nil || rep.Orders != limit || len(rep.Sales.Mismatches) != 0 {
		t.Errorf("the replay's check after order_summaries was built: %v", rep.Err())
	}
	final := c.must(http.StatusOK, "GET", path, "")
	var sales struct {
		Days []domain.DailySales `json:"days"`
	}
	if final.decode(t, &sales); len(sales.Days) == 0 {
		t.Errorf("no daily sales in %s once built: %s", path, final.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("daily sales answers while order_summaries was built: %v", answers)
	for s, k := range answers {
		if s != http.StatusOK && s != http.StatusServiceUnavailable {
			t.Errorf("%d answers with status %d", k, s)
		}
	}
	for _, body := range bodies {
		if body != string(final.Body) {
			t.Fatalf("an answer before the end differs from the built read model:\n%s\nwant\n%s", body, final.Body)
		}
	}
	var st struct {
		Projections []jobs.ProjectionStatus `json:"projections"`
	}
	c.must(http.StatusOK, "GET", "/v1/admin/projections", "", "Authorization", "Bearer "+token).decode(t, &st)
	for _, p := range st.Projections {
		if p.Name != def.Name {
			continue
		}
		if p.ActiveVersion != def.Ver() || !strings.HasPrefix(p.ActiveCollection, def.Key()+"_") || p.LastRebuild == nil ||
			p.LastRebuild.State != jobs.StateSucceeded || p.PreviousCollection != "" {
			t.Errorf("%s after the deploy: %+v; want a built collection at version %d, nothing before it", def.Name, p, def.Ver())
		}
		return
	}
	t.Errorf("no %s in the status", def.Name)
}
