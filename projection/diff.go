package projection

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math/bits"
	"reflect"
	"slices"
)

// Digest is an AdHash digest of a set of documents: the sum of their
// DocHash values modulo 2^256, so it does not depend on their order
// (Bellare and Micciancio, "A New Paradigm for Collision-free Hashing:
// Incrementality at Reduced Cost", EUROCRYPT 1997).
type Digest [4]uint64

// Add adds a document's hash to a.
func (a *Digest) Add(h [32]byte) {
	var carry uint64
	for i := 3; i >= 0; i-- {
		a[i], carry = bits.Add64(a[i], binary.BigEndian.Uint64(h[i*8:]), carry)
	}
}

// String is a in hex, 64 digits.
func (a Digest) String() string {
	var b [32]byte
	for i := range a {
		binary.BigEndian.PutUint64(b[i*8:], a[i])
	}
	return hex.EncodeToString(b[:])
}

// DocHash is the SHA-256 of a document's JSON (encoding/json: struct
// fields in order, map keys sorted).
func DocHash[D any](doc D) ([32]byte, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// DiffFields lists the top-level JSON fields in which a and b differ.
func DiffFields[D any](a, b D) []string {
	var ma, mb map[string]any
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	_ = json.Unmarshal(ja, &ma)
	_ = json.Unmarshal(jb, &mb)
	var out []string
	for k := range ma {
		if !reflect.DeepEqual(ma[k], mb[k]) {
			out = append(out, k)
		}
	}
	for k := range mb {
		if _, ok := ma[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
