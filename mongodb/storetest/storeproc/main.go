// Command storeproc runs the embedded store (internal/embedded.StartStore)
// on -dir and -addr for tests whose own binary runs under the race
// detector (storetest.StartStoreProcess): FerretDB and its SQLite then run
// at their normal speed. It prints "uri=<MongoDB URI>" once the store
// accepts connections and closes the store when its stdin ends, so it
// never outlives the test process that started it; with -remove it then
// removes -dir. It serves the store's test commands
// (embedded.WithTestCommands), as every store storetest starts does.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/orderd/orderd/internal/embedded"
)

func main() {
	dir := flag.String("dir", "", "the store's files")
	addr := flag.String("addr", "127.0.0.1:0", "the funnel's listen address")
	remove := flag.Bool("remove", false, "remove -dir once the store is closed")
	flag.Parse()
	s, err := embedded.StartStore(*dir, *addr, nil, embedded.WithTestCommands())
	if err != nil {
		fmt.Fprintln(os.Stderr, "storeproc:", err)
		os.Exit(1)
	}
	fmt.Println("uri=" + s.URI)
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = s.Close()
	if *remove {
		_ = os.RemoveAll(*dir)
	}
}
