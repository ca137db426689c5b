// Package cli holds what the orderd subcommands' command lines share.
package cli

import (
	"flag"
	"fmt"
	"io"
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
