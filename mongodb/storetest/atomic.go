package storetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The atomicity suite proves what leases, job claims and the read-model
// guard rely on: a conditional single-document update is atomic for every
// client of the store, in any process. Each round, goroutines in this
// process and in a second process (the test binary run again) race one
// conditional write on the same document; exactly one may win.

const (
	// racerEnv, when set, makes RunAtomicity act as the second process:
	// "<database> <mode> <rounds>".
	racerEnv  = "ORDERD_STORETEST_RACER"
	wonPrefix = "racer-won:"
	readyLine = "racer-ready"
	// racers race each round in each process.
	racers = 8
)

// RunAtomicity runs the atomicity suite against MongoURI, racing on rounds
// documents, one race each (1,000 when rounds is 0). The calling test
// must be reachable as -test.run=^<its name>$ in its binary: the second
// process runs it again with racerEnv set, and then RunAtomicity only races.
func RunAtomicity(t *testing.T, rounds int) {
	if rounds <= 0 {
		rounds = 1000
	}
	if spec := os.Getenv(racerEnv); spec != "" {
		runRacer(t, spec)
		return
	}
	t.Run("ConditionalUpdateOneWinner", func(t *testing.T) { testRace(t, "update", rounds) })
	t.Run("UpsertClaimOneWinner", func(t *testing.T) { testRace(t, "upsert", rounds) })
}

// testRace seeds the rounds' documents, starts the second process, races
// alongside it, and checks that every round had exactly one winner, the one
// the document names.
func testRace(t *testing.T, mode string, rounds int) {
	db := Database(t)
	coll := db.Collection("race")
	ctx := t.Context()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.CommandContext(ctx, self, "-test.run=^"+top+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MONGODB_URI="+MongoURI(t),
		fmt.Sprintf("%s=%s %s %d", racerEnv, db.Name(), mode, rounds))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start second process: %v", err)
	}
	lines := bufio.NewScanner(out)
	ready := false
	for !ready && lines.Scan() {
		ready = strings.TrimSpace(lines.Text()) == readyLine
	}
	if !ready {
		_ = cmd.Wait()
		t.Fatal("second process ended before racing")
	}
	won, holders, err := race(ctx, coll, mode, "p1", rounds, true)
	if err != nil {
		t.Fatalf("race: %v", err)
	}
	var theirs []int
	for lines.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(lines.Text()), wonPrefix); ok {
			r, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("second process output %q: %v", lines.Text(), err)
			}
			theirs = append(theirs, r)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("second process: %v", err)
	}

	winners := make([][]string, rounds)
	for _, r := range won {
		winners[r] = append(winners[r], "p1")
	}
	for _, r := range theirs {
		winners[r] = append(winners[r], "p2")
	}
	bad, cross := 0, 0
	for i, w := range winners {
		switch {
		case len(w) != 1:
			bad++
			if bad <= 5 {
				t.Errorf("round %d: %d winners %v, want exactly 1", i, len(w), w)
			}
		case !strings.HasPrefix(holders[i], w[0]+"/"):
			// A second writer overwrote the winner's write.
			t.Errorf("round %d: the document names %q, the winner was %s", i, holders[i], w[0])
		case w[0] == "p2":
			cross++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d rounds without exactly one winner", mode, bad, rounds)
	}
	if cross == 0 {
		t.Fatalf("%s: the second process won no round: the race was not between processes", mode)
	}
	t.Logf("%s: %d rounds of %d racers in each of 2 processes: one winner each (%d won by the second process)",
		mode, rounds, racers, cross)
}

// runRacer is the second process: it races the rounds once the first
// process signals the start, and prints each round it won on a line.
func runRacer(t *testing.T, spec string) {
	var dbName, mode string
	var rounds int
	if _, err := fmt.Sscanf(spec, "%s %s %d", &dbName, &mode, &rounds); err != nil {
		t.Fatalf("%s=%q: %v", racerEnv, spec, err)
	}
	coll := Client(t).Database(dbName).Collection("race")
	ctx := t.Context()
	// Connect before saying ready, so both processes start racing warm.
	if err := coll.Database().Client().Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println(readyLine)
	won, _, err := race(ctx, coll, mode, "p2", rounds, false)
	if err != nil {
		t.Fatalf("race: %v", err)
	}
	for _, r := range won {
		fmt.Println(wonPrefix + strconv.Itoa(r))
	}
}

// race runs every round in lockstep with the other process. The leader
// (the first process) seeds a round's document and announces the round in
// a signal document; both processes then release their racers together on
// the round's conditional write; the follower acknowledges the round, and
// the leader reads who holds the document and deletes it, so the
// collection stays small (FerretDB filters beyond _id in Go, over the
// whole collection). It returns the rounds this process won and, for the
// leader, each round's holder.
func race(ctx context.Context, coll *mongo.Collection, mode, proc string, rounds int, leader bool) ([]int, []string, error) {
	signal := coll.Database().Collection("race_signal")
	var (
		won     []int
		holders = make([]string, rounds)
	)
	for i := range rounds {
		if leader {
			if err := seed(ctx, coll, mode, i); err != nil {
				return nil, nil, err
			}
			if err := announce(ctx, signal, "round", i); err != nil {
				return nil, nil, err
			}
		} else if err := awaitSignal(ctx, signal, "round", i); err != nil {
			return nil, nil, err
		}
		wins, err := raceRound(ctx, coll, mode, proc, i)
		if err != nil {
			return nil, nil, fmt.Errorf("round %d: %w", i, err)
		}
		for range wins {
			won = append(won, i)
		}
		if !leader {
			if err := announce(ctx, signal, "ack", i); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err := awaitSignal(ctx, signal, "ack", i); err != nil {
			return nil, nil, err
		}
		var d struct {
			By    string `bson:"by"`
			Owner string `bson:"owner"`
		}
		if err := coll.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: roundID(i)}}).Decode(&d); err != nil {
			return nil, nil, fmt.Errorf("round %d: read the holder: %w", i, err)
		}
		holders[i] = d.By + d.Owner
	}
	return won, holders, nil
}

// seed prepares round i: a document in state "old" to update, or, for the
// claim, an expired claim to take over (even rounds) or none, so that the
// claim is an insert by upsert (odd rounds).
func seed(ctx context.Context, coll *mongo.Collection, mode string, i int) error {
	var doc bson.D
	switch {
	case mode == "update":
		doc = bson.D{{Key: "_id", Value: roundID(i)}, {Key: "state", Value: "old"}}
	case i%2 == 0:
		doc = bson.D{{Key: "_id", Value: roundID(i)}, {Key: "expires", Value: 0}, {Key: "owner", Value: ""}}
	default:
		return nil
	}
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		return fmt.Errorf("seed round %d: %w", i, err)
	}
	return nil
}

func announce(ctx context.Context, signal *mongo.Collection, name string, i int) error {
	_, err := signal.UpdateOne(ctx, bson.D{{Key: "_id", Value: name}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: i}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("announce %s %d: %w", name, i, err)
	}
	return nil
}

// awaitSignal polls the signal document until it reaches round i, for at
// most a minute.
func awaitSignal(ctx context.Context, signal *mongo.Collection, name string, i int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var d struct {
			N int `bson:"n"`
		}
		err := signal.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&d)
		if err == nil && d.N >= i {
			return nil
		}
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			return fmt.Errorf("await %s %d: %w", name, i, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("await %s %d: not signalled within a minute", name, i)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// raceRound releases racers goroutines together on round i and returns
// how many of them won.
func raceRound(ctx context.Context, coll *mongo.Collection, mode, proc string, i int) (int, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		wins  int
		first error
	)
	start := make(chan struct{})
	for g := range racers {
		wg.Go(func() {
			<-start
			ok, err := try(ctx, coll, mode, i, fmt.Sprintf("%s/%d", proc, g))
			mu.Lock()
			defer mu.Unlock()
			if ok {
				wins++
			}
			if err != nil && first == nil {
				first = err
			}
		})
	}
	close(start)
	wg.Wait()
	return wins, first
}

// try makes one racer's write: a compare-and-set of state (update), or a
// lease-style claim of an expired or missing document by upsert (upsert).
func try(ctx context.Context, coll *mongo.Collection, mode string, round int, who string) (bool, error) {
	id := roundID(round)
	if mode == "update" {
		res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "state", Value: "old"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: "new"}, {Key: "by", Value: who}}}})
		if err != nil {
			return false, err
		}
		return res.ModifiedCount == 1, nil
	}
	var got struct {
		Owner string `bson:"owner"`
	}
	err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}, {Key: "expires", Value: bson.D{{Key: "$lt", Value: 1}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: 2}, {Key: "owner", Value: who}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&got)
	if mongo.IsDuplicateKeyError(err) {
		return false, nil // another racer holds it
	}
	if err != nil {
		return false, err
	}
	return got.Owner == who, nil
}

func roundID(i int) string { return fmt.Sprintf("round-%05d", i) }
