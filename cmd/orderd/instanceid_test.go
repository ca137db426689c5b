//go:build !noembed

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKeptInstanceID: on the embedded store an instance without a
// configured id makes one on its first start and finds it in its data dir
// on every later one, so a restarted process takes back its own leases at
// once; another data dir is another instance.
func TestKeptInstanceID(t *testing.T) {
	dir := t.TempDir()
	first, err := keptInstanceID(dir)
	if err != nil || first == "" {
		t.Fatalf("first start: %q, %v", first, err)
	}
	again, err := keptInstanceID(dir)
	if err != nil || again != first {
		t.Fatalf("restart: %q, %v; want %q", again, err, first)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "instance-id")); err != nil || len(b) == 0 {
		t.Fatalf("instance-id file: %q, %v", b, err)
	}
	other, err := keptInstanceID(t.TempDir())
	if err != nil || other == first {
		t.Fatalf("another data dir: %q, %v; want an id other than %q", other, err, first)
	}
}
