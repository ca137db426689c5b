package projection

import (
	"hash/maphash"
	"testing"
)

// CollideVerifyKeys gives every document id the same key in Verify until
// the test ends.
func CollideVerifyKeys(t *testing.T) {
	old := idKey
	idKey = func(maphash.Seed, string) docKey { return 7 }
	t.Cleanup(func() { idKey = old })
}
