//go:build race

package storetest

// RaceBuild reports that this binary runs under the race detector.
const RaceBuild = true
