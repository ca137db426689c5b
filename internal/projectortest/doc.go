// Package projectortest runs the tests of the projectors, and of the jobs
// that need live projectors, against an embedded NATS server holding the
// event stream: it starts runners on it, publishes events as the relay
// would and waits for the runners' consumers to drain. The fixtures and
// the comparison of the read models with the log are package
// projectiontest's.
//
// Every helper takes the test's *testing.T and fails it on an error;
// everything it starts stops when the test ends.
package projectortest
