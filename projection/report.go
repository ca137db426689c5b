package projection

// VerifyReport is the result of comparing a read model with the fold of
// the log. A document is missing (the log has the stream, the read model
// not), stale (the read model is at a lower version: drift, or a projector
// still catching up), extra (no such stream in the log), or different (at
// the same or a higher version, some field differs). Digest and
// ExpectedDigest are AdHash sums (Bellare and Micciancio, "A New Paradigm
// for Collision-free Hashing", EUROCRYPT 1997: the sum modulo 2^256 of the
// SHA-256 of each document's JSON), of the read model as read and of the
// fold of the log; they are equal exactly when nothing drifted (up to
// hash collisions), whatever order the documents were read in.
type VerifyReport struct {
	Collection     string         `json:"collection"`
	Streams        int64          `json:"streams"`
	Events         int64          `json:"events"`
	Documents      int64          `json:"documents"`
	Missing        int64          `json:"missing"`
	Stale          int64          `json:"stale"`
	Extra          int64          `json:"extra"`
	Different      int64          `json:"different"`
	Repaired       int64          `json:"repaired"`
	PoisonStreams  int64          `json:"poison_streams"`
	Examples       []DriftExample `json:"examples"`
	Digest         string         `json:"digest"`
	ExpectedDigest string         `json:"expected_digest"`
}

// Drift is the number of documents that differ from the log.
func (r VerifyReport) Drift() int64 { return r.Missing + r.Stale + r.Extra + r.Different }

// DriftExample is one document that differs.
type DriftExample struct {
	ID            string   `json:"id"`
	Kind          string   `json:"kind"` // missing, stale, extra, different
	StoredVersion int64    `json:"stored_version"`
	LogVersion    int64    `json:"log_version"`
	Fields        []string `json:"fields,omitempty"` // top-level fields that differ
}

// add counts ex, a document that differs, by its kind (different when
// it is none of the others), and keeps it among the examples while its
// kind has fewer than examplesPerKind.
func (r *VerifyReport) add(ex DriftExample) {
	switch ex.Kind {
	case "extra":
		r.Extra++
	case "missing":
		r.Missing++
	case "stale":
		r.Stale++
	default:
		r.Different++
	}
	kinds := 0
	for _, e := range r.Examples {
		if e.Kind == ex.Kind {
			kinds++
		}
	}
	if kinds < examplesPerKind {
		r.Examples = append(r.Examples, ex)
	}
}
