package projection

import "time"

// Pointer is a projection's pointer document: which collection readers
// read, and which others live events go to. The storage adapter keeps it
// (package mongodb's Pointers, under the bson tags below); the projector
// and the jobs read it and the jobs move it. Only the holder of the
// projection's rebuild lock should write it (a rebuild's runner, a switch
// back), but a runner that stalled may wake up after its lease passed on:
// every write is therefore a compare-and-set on Generation, which each
// write increments.
//
// An empty Active means no version has been built yet (a projection added
// to a service whose log already holds events): readers get
// domain.ErrNotBuilt until the first build switches to its collection.
// A version field of 0 is version 1 (documents from before versions).
type Pointer struct {
	Projection      string `bson:"_id" json:"projection"`
	Active          string `bson:"active" json:"active_collection"`
	ActiveVersion   int    `bson:"active_version,omitempty" json:"active_version,omitempty"`
	Shadow          string `bson:"shadow,omitempty" json:"shadow_collection,omitempty"`
	ShadowVersion   int    `bson:"shadow_version,omitempty" json:"shadow_version,omitempty"`
	ShadowJob       string `bson:"shadow_job,omitempty" json:"shadow_job,omitempty"`
	Previous        string `bson:"previous,omitempty" json:"previous_collection,omitempty"`
	PreviousVersion int    `bson:"previous_version,omitempty" json:"previous_version,omitempty"`
	// SwitchedBackFrom is the version an operator switched back from: it
	// is not built again on its own (a higher version is).
	SwitchedBackFrom int `bson:"switched_back_from,omitempty" json:"switched_back_from,omitempty"`
	// Broken is why the active collection cannot be trusted: a rollup
	// that lost log positions (ErrPositionsLost). Readers do not read it,
	// and a build of its version repairs it; "" when it can.
	Broken     string    `bson:"broken,omitempty" json:"broken,omitempty"`
	Generation int64     `bson:"generation" json:"generation"`
	SwitchedAt time.Time `bson:"switched_at,omitempty" json:"switched_at,omitzero"`
}

// ActiveVer is the version of the active collection: 0 when none is
// built, else at least 1.
func (p Pointer) ActiveVer() int { return roleVer(p.Active, p.ActiveVersion) }

// ShadowVer is the version of the shadow collection, 0 when there is none.
func (p Pointer) ShadowVer() int { return roleVer(p.Shadow, p.ShadowVersion) }

// PreviousVer is the version of the previous collection, 0 when there is
// none.
func (p Pointer) PreviousVer() int { return roleVer(p.Previous, p.PreviousVersion) }

// roleVer is the version of coll, stored as v in the pointer: 0 when
// there is no coll, else at least 1.
func roleVer(coll string, v int) int {
	if coll == "" {
		return 0
	}
	return max(v, 1)
}

// Collections returns the collections of version v that live events go
// to: the shadow, the previous and the active collection, in that order,
// each if it is of version v. With no pointer document (Generation 0: a
// store no service has started on; the MongoDB adapter's
// Pointers.Ensure writes the first) it is
// the active collection, whatever v.
func (p Pointer) Collections(v int) []string {
	if p.Generation == 0 {
		return []string{p.Active}
	}
	var out []string
	if p.ShadowVer() == v {
		out = append(out, p.Shadow)
	}
	if p.PreviousVer() == v {
		out = append(out, p.Previous)
	}
	if p.ActiveVer() == v {
		out = append(out, p.Active)
	}
	return out
}

// Names reports whether the pointer names collection coll in any role.
func (p Pointer) Names(coll string) bool {
	return coll != "" && (p.Active == coll || p.Shadow == coll || p.Previous == coll)
}
