package projection_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/orderd/orderd/domain"
	"github.com/orderd/orderd/projection"
)

// A verify sums the documents of a read model in the order it reads them
// and the folds of the log in log order: the digest must not depend on it.
func TestDigestIgnoresOrder(t *testing.T) {
	docs := []domain.Order{{ID: "o-1", Status: domain.StatusCreated}, {ID: "o-2", Status: domain.StatusApproved}, {ID: "o-3", TotalCents: 990}}
	digest := func(order []int) string {
		var d projection.Digest
		for _, i := range order {
			h, err := projection.DocHash(docs[i])
			if err != nil {
				t.Fatal(err)
			}
			d.Add(h)
		}
		return d.String()
	}
	if a, b := digest([]int{0, 1, 2}), digest([]int{2, 0, 1}); a != b {
		t.Errorf("digest of the same documents in two orders: %s and %s", a, b)
	}
	if a, b := digest([]int{0, 1}), digest([]int{0, 2}); a == b {
		t.Errorf("digest of different documents: both %s", a)
	}
}

func TestDiffFieldsNamesTheJSONFieldsThatDiffer(t *testing.T) {
	a := domain.Order{ID: "o-1", Status: domain.StatusShipped, TotalCents: 990, Version: 4}
	b := a
	b.Status, b.Version = domain.StatusDelivered, 5
	if got, want := projection.DiffFields(a, b), []string{"status", "version"}; !slices.Equal(got, want) {
		t.Errorf("DiffFields: %v, want %v", got, want)
	}
	if got := projection.DiffFields(a, a); len(got) != 0 {
		t.Errorf("DiffFields of equal documents: %v", got)
	}
}

// Fold stops at the first event that cannot be applied and returns the
// document as the events before it left it, as the live projection does.
func TestFoldStopsAtThePoisonEvent(t *testing.T) {
	poison := errors.New("poison")
	def := projection.Definition[int]{
		Apply: func(n *int, e domain.Event) error {
			if e.Version == 3 {
				return poison
			}
			*n++
			return nil
		},
	}
	evs := []domain.Event{{StreamID: "s", Version: 1}, {StreamID: "s", Version: 2}, {StreamID: "s", Version: 3}, {StreamID: "s", Version: 4}}
	doc, n, err := def.Fold(evs)
	if doc != 2 || n != 2 || !errors.Is(err, poison) {
		t.Errorf("Fold: doc %d, %d applied, %v; want 2, 2 and the poison error", doc, n, err)
	}
	if doc, n, err := def.Fold(evs[:2]); doc != 2 || n != 2 || err != nil {
		t.Errorf("Fold of good events: doc %d, %d applied, %v", doc, n, err)
	}
}
