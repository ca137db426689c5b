// Package projection says what the read models are, independently of how
// they are stored: documents folded from the event log, one per order
// stream, which any delivery of the events (late, twice, out of order, by
// racing processes) must leave equal to the fold of the log.
//
// The service runs one projection, order_summaries: a domain.Order per
// order stream, the same fold as the aggregate. A customer's stats and the
// daily sales are sums over it, made on read (SumStats, SumSales over
// StatsGroup and SalesGroup rows that the store groups or sends one per
// order). A Definition says how to fold a document and which version it
// reflects; Definition.Fold folds a stream from nothing, and
// Definition.Advance brings a stored document up to a delivery of events,
// filling gaps through a Log and telling poison (events that cannot be
// applied, PoisonError) from failures that may pass (Passes). Nothing in
// the machinery is particular to order_summaries: the tests run it on a
// second projection of their own. A verify compares read models with the
// fold by DocHash (the SHA-256 of a document's JSON), sums them into a
// Digest (AdHash, independent of order) and names what differs with
// DiffFields. An Outcome counts what applying a batch did; Metrics are the
// projections' Prometheus metrics.
//
// Model is a projection as the service runs it: a ReadModel per
// collection its pointer names, the loop over a delivery (ApplyAll: a
// rebuild's shadow first), the rebuild's writes (WriteFolds), Verify,
// VerifySums and Check. Each ReadModel caches the documents it wrote and
// folds a delivery through Definition.Advance.
//
// The package imports no storage: it declares what it needs (Store, the
// documents of named collections, every save a compare-and-set on the
// version; Pointers; Log), and the MongoDB adapter implements it
// (mongodb.Documents). Package projector feeds the projections from NATS
// JetStream and package jobs rebuilds and verifies them.
package projection
