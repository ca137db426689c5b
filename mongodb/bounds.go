package mongodb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Commits returns the number of commits in the log, from the collection's
// statistics ($collStats count, summed over the shards): metadata on
// MongoDB, where it may be off after an unclean shutdown until the next
// validate. Not the count command: FerretDB reads and decodes the whole
// collection for it, while it answers $collStats from SQLite's page
// statistics, far faster (docs/embedded-store.md, "Differences that
// remain"). Errors:
// domain.ErrUnavailable.
func (s *EventStore) Commits(ctx context.Context) (int64, error) {
	cur, err := s.commits.Aggregate(ctx, mongo.Pipeline{{{Key: "$collStats", Value: bson.D{{Key: "count", Value: bson.D{}}}}}})
	if err != nil {
		return 0, fmt.Errorf("count commits: %w", Translate(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var n int64
	for cur.Next(ctx) {
		c, ok := cur.Current.Lookup("count").AsInt64OK()
		if !ok {
			return 0, fmt.Errorf("count commits: $collStats count is %s", cur.Current.Lookup("count"))
		}
		n += c
	}
	if err := cur.Err(); err != nil {
		return 0, fmt.Errorf("count commits: %w", Translate(err))
	}
	return n, nil
}

// boundsSample is how many commit ids Bounds keeps to cut the log: with
// it the partitions' sizes are within about 2% of each other (the
// standard error of a quantile of a 4,096 sample) whatever the log's size.
const boundsSample = 4096

// Bounds splits the log into n ranges of about equal numbers of commits,
// cut at stream starts: it returns up to n-1 ascending stream ids, each the
// first stream of the next range (fewer when the log has fewer streams),
// and the number of commits in the log. It reads every commit id once,
// unsorted, and keeps a uniform sample of boundsSample of them (reservoir
// sampling, Vitter's Algorithm R, "Random Sampling with a Reservoir",
// ACM TOMS 1985), so its memory does not grow with the log; a log of up
// to boundsSample commits is cut exactly. Errors: domain.ErrUnavailable.
func (s *EventStore) Bounds(ctx context.Context, n int) (bounds []string, commits int64, err error) {
	var sample []string
	err = s.eachID(ctx, bson.D{}, func(id string) {
		commits++
		if len(sample) < boundsSample {
			sample = append(sample, id)
		} else if j := rand.Int64N(commits); j < boundsSample {
			sample[j] = id
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("partition bounds: %w", err)
	}
	slices.Sort(sample)
	for i := 1; i < n && len(sample) > 0; i++ {
		id := streamOf(sample[len(sample)*i/n])
		if len(bounds) == 0 || bounds[len(bounds)-1] < id {
			bounds = append(bounds, id)
		}
	}
	return bounds, commits, nil
}
