package projection

// Outcome counts what one Apply did.
type Outcome struct {
	Applied    int // events folded into documents
	Duplicates int // events at or below the stored version, skipped
	GapsFilled int // streams whose gap was read from the log
	Superseded int // writes the version guard refused: a newer version was stored
}

// Add adds p's counts to o.
func (o *Outcome) Add(p Outcome) {
	o.Applied += p.Applied
	o.Duplicates += p.Duplicates
	o.GapsFilled += p.GapsFilled
	o.Superseded += p.Superseded
}

// PoisonError is a stream's events that cannot be applied. Reached is the
// version the stream's document reflects despite them: events up to it
// were applied and may be acknowledged.
type PoisonError struct {
	Reached int64
	Err     error
}

func (e *PoisonError) Error() string { return e.Err.Error() }
func (e *PoisonError) Unwrap() error { return e.Err }
