// Package projectionstest runs the tests of the projection runners, and
// of the jobs that need live runners, against an embedded NATS server
// holding the event stream: it publishes events as the relay would and
// waits for the runners' consumers to drain.
//
// Every helper takes the test's *testing.T and fails it on an error;
// everything it starts stops when the test ends.
package projectionstest
