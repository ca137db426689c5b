package mongodb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/orderd/orderd/domain"
)

// A store nobody listens on: the driver gives up server selection with a
// deadline error of its own, which must read as unavailable (503), not as
// the caller's deadline (500).
func TestTranslateServerSelection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // now nothing listens there
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/").SetServerSelectionTimeout(200 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	err = c.Database("d").Collection("c").FindOne(t.Context(), bson.D{}).Err()
	if err == nil {
		t.Fatal("FindOne on a closed port succeeded")
	}
	if got := Translate(err); !errors.Is(got, domain.ErrUnavailable) {
		t.Errorf("Translate(%v) = %v; want it to wrap domain.ErrUnavailable", err, got)
	}
	// The caller's own deadline or cancellation stays what it is.
	for _, e := range []error{context.DeadlineExceeded, context.Canceled, nil} {
		if got := Translate(e); got != e {
			t.Errorf("Translate(%v) = %v; want it unchanged", e, got)
		}
	}
}

// A pool whose connections are all busy reports the caller's deadline
// inside its own error; it is the store that is saturated (503), not the
// request that ran late (500).
func TestTranslatePoolExhausted(t *testing.T) {
	err := fmt.Errorf("find summary: %w", topology.WaitQueueTimeoutError{Wrapped: context.DeadlineExceeded})
	if got := Translate(err); !errors.Is(got, domain.ErrUnavailable) {
		t.Errorf("Translate(%v) = %v; want it to wrap domain.ErrUnavailable", err, got)
	}
}

// TestTranslateElectionCodes: what a new primary, a secondary and mongos
// answer while a replica set elects or a shard refreshes passes: it must
// read as unavailable (a redelivery, a 503), never as a poison event that
// a projection would park with every later event of its order.
func TestTranslateElectionCodes(t *testing.T) {
	for _, code := range []int32{64, 91, 133, 134, 189, 10107, 11600, 11601, 11602, 13388, 13435, 13436, 63, 150} {
		err := fmt.Errorf("fill gap: %w", mongo.CommandError{Code: code, Message: "electing"})
		if got := Translate(err); !errors.Is(got, domain.ErrUnavailable) {
			t.Errorf("code %d: Translate = %v, want it to wrap domain.ErrUnavailable", code, got)
		}
	}
	// A server's answer that will not change stays what it is.
	for _, code := range []int32{2, 11000, 121} { // BadValue, DuplicateKey, DocumentValidationFailure
		err := mongo.CommandError{Code: code, Message: "refused"}
		if got := Translate(err); errors.Is(got, domain.ErrUnavailable) {
			t.Errorf("code %d: Translate = %v, want it not unavailable", code, got)
		}
	}
}
