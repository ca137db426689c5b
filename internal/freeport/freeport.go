// Package freeport hands tests loopback TCP ports for servers they stop
// and start again on the same address.
//
// A port taken by listening on port 0 comes from the kernel's ephemeral
// range, which is also where outgoing connections get their local ports:
// while a test's server is down, any connection made on the machine may
// take its port, and the restart fails with "address already in use".
// Ports handed out here lie below that range, where the kernel never
// assigns one by itself, and none is handed out twice in a process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// Below the ephemeral range on Linux (32768-60999 unless tuned, see
// /proc/sys/net/ipv4/ip_local_port_range) and above the ports services
// usually take.
const defaultLow, defaultHigh = 20000, 32768

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Port returns a loopback TCP port that was free a moment ago, lies
// outside the ephemeral range and was not returned before in this
// process. It fails the test when none is found in 1,000 tries.
func Port(t testing.TB) int {
	t.Helper()
	low, high := bounds()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		p := low + rand.IntN(high-low)
		if given[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = ln.Close()
		given[p] = true
		return p
	}
	t.Fatalf("freeport: no free port in [%d, %d)", low, high)
	return 0
}

// bounds is the range ports are drawn from: below the kernel's ephemeral
// range when that leaves room, else the default.
func bounds() (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultLow, defaultHigh
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo-1024 < 4096 {
		return defaultLow, defaultHigh
	}
	return max(1024, lo-12768), lo
}
