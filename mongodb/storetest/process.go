package storetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/orderd/orderd/internal/embedded"
)

// StoreProcess is the embedded store run in a process of its own
// (command storeproc), built without the race detector.
type StoreProcess struct {
	URI   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
	close sync.Once
	err   error
}

// StartStoreProcess starts the embedded store on dir and addr (as
// embedded.StartStore does) in a process of its own, through go run, whose
// executable the build cache keeps. Tests built with -race use it so that
// FerretDB and its SQLite, which are not the code under test, do not run
// under the detector: in-process they were most of the CPU time of the
// packages that use the store. The process ends when Close is called or
// this process exits (its stdin closes). Like every store storetest
// starts, it serves the store's test commands (embedded.WithTestCommands).
func StartStoreProcess(dir, addr string) (*StoreProcess, error) {
	return startStoreProcess(dir, addr, false)
}

// startStore starts the embedded store, with its test commands, on dir and
// a free loopback port: in a process of its own (startStoreProcess, which
// removes dir at its end when remove is set) when this binary runs under
// the race detector, unless ORDERD_TEST_STORE=inprocess, else in this
// process. It returns the store's URI and its Close.
func startStore(dir string, remove bool) (string, func() error, error) {
	if RaceBuild && os.Getenv("ORDERD_TEST_STORE") != "inprocess" {
		p, err := startStoreProcess(dir, "127.0.0.1:0", remove)
		if err != nil {
			return "", nil, err
		}
		return p.URI, p.Close, nil
	}
	s, err := embedded.StartStore(dir, "127.0.0.1:0", slog.New(slog.DiscardHandler), embedded.WithTestCommands())
	if err != nil {
		return "", nil, err
	}
	return s.URI, s.Close, nil
}

// startStoreProcess is StartStoreProcess; with remove, the process removes
// dir once the store is closed.
func startStoreProcess(dir, addr string, remove bool) (*StoreProcess, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goCmd, "run", "github.com/orderd/orderd/mongodb/storetest/storeproc", "-dir", dir, "-addr", addr,
		"-remove="+strconv.FormatBool(remove))
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("store process: %w", err)
	}
	p := &StoreProcess{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	uri := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if u, ok := strings.CutPrefix(lines.Text(), "uri="); ok {
				uri <- u
			}
		}
		close(uri)
		p.done <- cmd.Wait()
	}()
	select {
	case u, ok := <-uri:
		if !ok {
			return nil, fmt.Errorf("store process ended before serving: %v", <-p.done)
		}
		p.URI = u
		return p, nil
	case <-time.After(5 * time.Minute): // a build on a cold cache included
		_ = cmd.Process.Kill()
		return nil, errors.New("store process: not serving within 5m")
	}
}

// Close stops the store and waits for its process to end: requests in
// flight are dropped, as by embedded.Store.Close. Calls after the first
// return its result.
func (p *StoreProcess) Close() error {
	p.close.Do(func() {
		_ = p.stdin.Close()
		select {
		case p.err = <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			p.err = errors.New("store process: did not stop within 30s, killed")
		}
	})
	return p.err
}
