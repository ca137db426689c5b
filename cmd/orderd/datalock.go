//go:build !noembed

package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// dataLock is the exclusive hold of one process on an embedded data dir:
// two servers on one dir would run two stores on one SQLite file, two
// NATS servers on one JetStream dir and one instance id for both. It is
// an flock(2) on <data-dir>/orderd.lock, which the kernel drops when the
// process ends however it ends, so a killed server leaves no stale lock.
type dataLock struct {
	f    *os.File
	info lockHolder
}

// lockHolder is what the lock file says of the process holding it, so
// that a refused start can name it.
type lockHolder struct {
	PID     int       `json:"pid"`
	HTTP    string    `json:"http,omitempty"`
	Store   string    `json:"store,omitempty"`
	NATS    string    `json:"nats,omitempty"`
	Started time.Time `json:"started"`
}

// lockDataDir takes the lock of dir (made if missing) for this process.
// A dir held by another process is an error naming that process's pid and
// addresses and what to do instead; it is returned at once, without
// waiting for the other to stop.
func lockDataDir(dir string) (*dataLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "orderd.lock")
	// Not truncated on open: the holder's record must survive a refused
	// start's open.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir lock %s: %w", path, err)
		}
		return nil, inUse(dir, b)
	}
	l := &dataLock{f: f, info: lockHolder{PID: os.Getpid(), Started: time.Now().UTC().Truncate(time.Second)}}
	if err := l.write(); err != nil {
		l.release()
		return nil, err
	}
	return l, nil
}

// inUse is the refusal of a start on a dir another process holds,
// described by its lock file's content b.
func inUse(dir string, b []byte) error {
	var h lockHolder
	who := "another orderd process"
	if json.Unmarshal(b, &h) == nil && h.PID > 0 {
		who = fmt.Sprintf("orderd pid %d (http %s, store %s, nats %s, started %s)",
			h.PID, cmp.Or(h.HTTP, "none"), cmp.Or(h.Store, "none"), cmp.Or(h.NATS, "none"), h.Started.Format(time.RFC3339))
	}
	return fmt.Errorf("data dir %s is in use by %s: set another -data-dir (ORDERD_DATA_DIR) for this one, or stop that one", dir, who)
}

// setHTTP records the address this process serves HTTP on once it is
// bound. A nil lock (no embedded server) records nothing.
func (l *dataLock) setHTTP(addr string) error {
	if l == nil {
		return nil
	}
	l.info.HTTP = addr
	return l.write()
}

// setServers records the servers' addresses once the embedded ones
// listen; "" for none.
func (l *dataLock) setServers(store, nats string) error {
	l.info.Store, l.info.NATS = store, nats
	return l.write()
}

func (l *dataLock) write() error {
	b, err := json.Marshal(l.info)
	if err != nil {
		return err
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("data dir lock: %w", err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("data dir lock: %w", err)
	}
	return nil
}

// release lets another process have the dir. The file stays: removing it
// could let two processes hold locks on two different files of one path.
// A nil lock has nothing to release.
func (l *dataLock) release() {
	if l != nil {
		_ = l.f.Close()
	}
}
