// Package cli holds what the orderd subcommands' command lines share.
package cli

import (
	"flag"
	"fmt"
	"io"
	"net"
)

// FlagSet returns the flags of subcommand name. Parse returns its errors
// instead of exiting, so a subcommand can be run as a function; -h, or a
// flag it does not know, prints usage and then the flags' defaults to
// stderr.
func FlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	return fs
}

// Parse parses args into fs, a subcommand that takes flags only: a
// positional argument is an error naming the subcommand. It returns
// flag.ErrHelp for -h.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q (see -h)", fs.Name(), fs.Args())
	}
	return nil
}

// DefaultDataDir is where `orderd serve` keeps the embedded servers' data
// when neither -data-dir nor ORDERD_DATA_DIR says otherwise.
const DefaultDataDir = "./data"

// DefaultServiceURL is the service's address when nothing says otherwise:
// `orderd serve` listens on 127.0.0.1:8080 by default.
const DefaultServiceURL = "http://127.0.0.1:8080"

// ServiceURL is the default base URL of the service a subcommand talks
// to: ORDERD_URL when set, else where ORDERD_HTTP_ADDR makes the server
// listen (the same variable, so a server moved to another port is found
// without a flag; an address on every interface is reached on loopback),
// else DefaultServiceURL.
func ServiceURL(getenv func(string) string) string {
	if u := getenv("ORDERD_URL"); u != "" {
		return u
	}
	addr := getenv("ORDERD_HTTP_ADDR")
	if addr == "" {
		return DefaultServiceURL
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return DefaultServiceURL
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
