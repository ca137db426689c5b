package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/mongodb"
)

// lockDoc is a projection's rebuild lock: the job holding it, since when.
type lockDoc struct {
	ID    string    `bson:"_id"`
	Job   string    `bson:"job_id"`
	Since time.Time `bson:"since"`
}

// lock takes the projection's rebuild lock for job: an insert, so exactly
// one of concurrent requests gets it. A lock whose job has finished, or
// whose job was never created (its creator died), is taken over.
func (j *Jobs) lock(ctx context.Context, projection, job string) error {
	key := "rebuild:" + projection
	for attempt := 0; attempt < 3; attempt++ {
		_, err := j.locks.InsertOne(ctx, lockDoc{ID: key, Job: job, Since: j.now().UTC()})
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongodb.Translate(err))
		}
		var l lockDoc
		if err := j.locks.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&l); err != nil {
			if errors.Is(err, mongo.ErrNoDocuments) {
				continue
			}
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongodb.Translate(err))
		}
		held, err := j.jobs.FindOne(ctx, bson.D{{Key: "_id", Value: l.Job}}).Raw()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments) && j.now().Sub(l.Since) < time.Minute:
			return fmt.Errorf("rebuild %s is being created: %w", l.Job, domain.ErrJobRunning)
		case err != nil && !errors.Is(err, mongo.ErrNoDocuments):
			return fmt.Errorf("rebuild lock of %s: %w", projection, mongodb.Translate(err))
		case err == nil && !domain.JobState(held.Lookup("state").StringValue()).Final():
			return fmt.Errorf("rebuild %s: %w", l.Job, domain.ErrJobRunning)
		}
		if err := j.unlock(ctx, projection, l.Job); err != nil {
			return err
		}
	}
	return fmt.Errorf("rebuild lock of %s: contended: %w", projection, domain.ErrJobRunning)
}

func (j *Jobs) unlock(ctx context.Context, projection, job string) error {
	_, err := j.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: "rebuild:" + projection}, {Key: "job_id", Value: job}})
	if err != nil {
		return fmt.Errorf("rebuild lock of %s: %w", projection, mongodb.Translate(err))
	}
	return nil
}
