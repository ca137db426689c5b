//go:build race

package main

// raceBuild: this test binary runs under the race detector.
const raceBuild = true
