// Command orderd is the event-sourced order service: the REST API, the
// outbox relay and the projection workers, in one process or split by
// role, and the operator's tools: status, rebuild, verify, the Olist
// importer and the load generator.
//
// This package only reads the configuration (config.go: environment
// variables, then flags) and wires the packages together (app.go: Main);
// the subcommands live beside it: operator (status, rebuild, verify),
// olist (import-olist) and loadgen. The admin API they call is package
// admin; the embedded servers are package internal/embedded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/orderd/orderd/cmd/orderd/loadgen"
	"github.com/orderd/orderd/cmd/orderd/olist"
	"github.com/orderd/orderd/cmd/orderd/operator"
)

const usage = `orderd: an event-sourced order service.

Usage:
  orderd [serve] [flags]     run the service (all roles, embedded servers by default)
  orderd import-olist [flags]
                             import the Olist sample as REST commands and check every order
  orderd replay [flags]      the same as import-olist
  orderd rebuild <projection> [flags]
                             rebuild a read model from the event log and switch to it
  orderd verify <projection> [flags]
                             compare a read model with the event log, optionally repair it
  orderd status [flags]      show each read model: versions, collection, lag, dead letters, last verify and rebuild
  orderd switch-back <projection> [flags]
                             point readers back at the collection the last switch replaced
  orderd loadgen [flags]     drive orders through their lifecycle against a service on loopback,
                             with racing commands, and report what was acknowledged
  orderd help                this text

rebuild, verify, status and switch-back call the admin API of a running service: set ADMIN_TOKEN
to the token the service was started with.

Run "orderd <command> -h" (serve, import-olist, rebuild, verify, status, switch-back, loadgen) for its flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "orderd:", err)
		os.Exit(1)
	}
}

// run runs the command args name; -h of any command, having printed its
// help, is a success.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := command(ctx, args, stdout, stderr); !errors.Is(err, flag.ErrHelp) {
		return err
	}
	return nil
}

func command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	} else if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		cmd = "help" // every subcommand, not only serve's flags
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "import-olist", "replay":
		return olist.Main(ctx, args, stdout, stderr)
	case "rebuild":
		return operator.Rebuild(ctx, args, os.Getenv, stdout, stderr)
	case "verify":
		return operator.Verify(ctx, args, os.Getenv, stdout, stderr)
	case "status":
		return operator.Status(ctx, args, os.Getenv, stdout, stderr)
	case "switch-back":
		return operator.SwitchBack(ctx, args, os.Getenv, stdout, stderr)
	case "loadgen":
		return loadgen.Main(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	m := NewMain()
	if err := m.ParseFlags(args, os.Getenv, stderr); err != nil {
		return err // flag.ErrHelp after -h
	}
	if err := m.Run(ctx); err != nil {
		_ = m.Close()
		return err
	}
	<-ctx.Done()
	return m.Close()
}
