// Package projectionstest gives the tests of the read models and of the
// jobs that rebuild and verify them one set of fixtures: order streams
// appended to a real event store with their expected folds, an embedded
// NATS server with the event stream, a comparison of both read models with
// the fold of the log, and readers of the Prometheus metrics.
//
// Every helper takes the test's *testing.T and fails it on an error;
// everything it starts stops when the test ends.
package projectionstest
