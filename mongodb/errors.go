package mongodb

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/orderd/orderd/domain"
)

// Translate returns err wrapping domain.ErrUnavailable when it is not a
// server's answer (network, timeout, server selection) or is a server
// error that passes (see Transient); other server errors and context
// errors are returned as they are, nil as nil.
func Translate(err error) error {
	// No server could be selected in time: the driver reports it with the
	// deadline of its serverSelectionTimeout, but the store is what failed.
	var sel topology.ServerSelectionError
	if errors.As(err, &sel) {
		return fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
	}
	// Every pooled connection is busy: the store is saturated, which
	// passes; the error wraps the caller's deadline, but the pool is what
	// failed.
	var pool topology.WaitQueueTimeoutError
	if errors.As(err, &pool) {
		return fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var se mongo.ServerError
	if errors.As(err, &se) && !mongo.IsNetworkError(err) && !Transient(se) {
		return err
	}
	return fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
}

// Transient reports a server error that passes: a failover, a node
// shutting down, a time limit (codes from MongoDB's error_codes.yml), or
// one the server labels retryable.
func Transient(se mongo.ServerError) bool {
	if se.HasErrorLabel("RetryableWriteError") || se.HasErrorLabel("TransientTransactionError") {
		return true
	}
	for _, code := range []int{6, 7, 50, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436} {
		if se.HasErrorCode(code) {
			return true
		}
	}
	return false
}
