// Package bustest starts NATS JetStream clusters for tests: three servers
// (or any number) from the nats-server library the project pins, on
// loopback in the test process, each node stopped and started again on its
// ports and store as a test kills and restarts it.
package bustest
