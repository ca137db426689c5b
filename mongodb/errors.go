package mongodb

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/orderd/orderd/domain"
)

// Translate returns err wrapping domain.ErrUnavailable when it is not a
// server's answer (network, timeout, server selection) or is a server
// error that passes (see transient); other server errors and context
// errors are returned as they are, nil as nil.
func Translate(err error) error {
	var (
		sel  topology.ServerSelectionError
		pool topology.WaitQueueTimeoutError
		se   mongo.ServerError
	)
	switch {
	// No server could be selected in time: the driver reports it with the
	// deadline of its serverSelectionTimeout, but the store is what failed.
	// Every pooled connection is busy: the store is saturated, which
	// passes; the error wraps the caller's deadline, but the pool is what
	// failed.
	case errors.As(err, &sel), errors.As(err, &pool):
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &se) && !mongo.IsNetworkError(err) && !transient(se):
		return err
	}
	return fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
}

// transient reports a server error that passes: a failover, a node
// shutting down, a time limit (codes from MongoDB's error_codes.yml), or
// one the server labels retryable.
func transient(se mongo.ServerError) bool {
	return se.HasErrorLabel("RetryableWriteError") || se.HasErrorLabel("TransientTransactionError") ||
		slices.ContainsFunc(transientCodes, se.HasErrorCode)
}

// transientCodes are the server errors that pass, from MongoDB's
// error_codes.yml: a member unreachable or shutting down, an election
// (what a new primary and mongos answer while one runs), a time limit,
// and a shard's routing table being refreshed.
var transientCodes = []int{
	6,     // HostUnreachable
	7,     // HostNotFound
	50,    // MaxTimeMSExpired
	63,    // StaleShardVersion
	64,    // WriteConcernFailed
	89,    // NetworkTimeout
	91,    // ShutdownInProgress
	133,   // FailedToSatisfyReadPreference
	134,   // ReadConcernMajorityNotAvailableYet
	150,   // StaleEpoch
	189,   // PrimarySteppedDown
	262,   // ExceededTimeLimit
	9001,  // SocketException
	10107, // NotWritablePrimary
	11600, // InterruptedAtShutdown
	11601, // Interrupted
	11602, // InterruptedDueToReplStateChange
	13388, // StaleConfig
	13435, // NotPrimaryNoSecondaryOk
	13436, // NotPrimaryOrSecondary
}
