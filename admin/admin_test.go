package admin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/orderd/orderd/admin"
	"github.com/orderd/orderd/domain"
	orderhttp "github.com/orderd/orderd/http"
	"github.com/orderd/orderd/projection"
)

var _ orderhttp.Admin = (*admin.Service)(nil)

// readModel is a projection whose check of every order answers check.
type readModel struct{ check projection.ReadModelCheck }

func (r readModel) Check(context.Context, string) (projection.ReadModelCheck, error) {
	return r.check, nil
}

// TestServiceRejectsUnknownIDs: ids that name nothing answer
// domain.ErrNotFound before any query, so the admin routes answer 404.
func TestServiceRejectsUnknownIDs(t *testing.T) {
	ctx := context.Background()
	s := admin.New(admin.Config{ReadModels: []admin.ReadModel{readModel{projection.ReadModelCheck{State: "equal"}}}})
	if _, err := s.Job(ctx, "not a job id!"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("Job(bad id) = %v, want ErrNotFound", err)
	}
	if _, err := s.CancelJob(ctx, "../x"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("CancelJob(bad id) = %v, want ErrNotFound", err)
	}
	if _, err := s.DeadLetters(ctx, "no_such_projection", 10); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("DeadLetters(unknown projection) = %v, want ErrNotFound", err)
	}
	if err := s.RetryDeadLetter(ctx, "no_such_projection:o-1:3"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("RetryDeadLetter(unknown projection) = %v, want ErrNotFound", err)
	}
	if _, err := s.ReadModels(ctx, "o-unknown"); !errors.Is(err, domain.ErrNotFound) {
		t.Errorf("ReadModels(order in no read model and not in the log) = %v, want ErrNotFound", err)
	}
}

// TestServiceReadModels returns every read model's check once one of them
// knows the order.
func TestServiceReadModels(t *testing.T) {
	known := projection.ReadModelCheck{Projection: "order_summaries", State: "equal", StoredVersion: 3, LogVersion: 3}
	s := admin.New(admin.Config{ReadModels: []admin.ReadModel{readModel{known}, readModel{projection.ReadModelCheck{State: "equal"}}}})
	got, err := s.ReadModels(context.Background(), "o-1")
	if err != nil || len(got) != 2 || got[0].StoredVersion != 3 {
		t.Fatalf("ReadModels = %+v, %v; want both checks, the first at v3", got, err)
	}
}
