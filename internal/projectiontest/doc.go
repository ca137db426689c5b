// Package projectiontest gives the tests of the read models, of the
// projectors that feed them and of the jobs that rebuild and verify them
// one set of fixtures: order streams appended to a real event store with
// their expected folds, a comparison of both read models with the fold of
// the log, readers of the Prometheus metrics, and the plumbing of a test
// body (its context, logger, goroutines and polling).
//
// Every helper takes the test's *testing.T and fails it on an error;
// everything it starts stops when the test ends.
package projectiontest
