package eventstore

import "context"

// ResolvedScanMethod is how s reads the log in order on its server.
func ResolvedScanMethod(ctx context.Context, s *Store) (ScanMethod, error) { return s.scanMethod(ctx) }

// WithIDBudget makes a ScanByID pass hold about n commit ids.
func WithIDBudget(n int) Option { return func(s *Store) { s.idBudget = n } }
