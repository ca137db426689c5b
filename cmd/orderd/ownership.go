package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// ownershipLog appends one JSON line per start and stop of this process's
// ownership of a projection partition: {"owner", "projection",
// "partition", "event": "start"|"stop", "at"}. A start is written before
// the owner's first write to the partition and a stop after its last, so
// the interval between them covers every write it made as the lease
// holder; a process killed while it owns a partition leaves a start
// without a stop. Each line is one write(2) on a file opened with
// O_APPEND, so it survives the process being killed.
type ownershipLog struct {
	owner string
	mu    sync.Mutex
	f     *os.File
}

// ownershipRecord is one line of an ownership log.
type ownershipRecord struct {
	Owner      string    `json:"owner"`
	Projection string    `json:"projection"`
	Partition  int       `json:"partition"`
	Event      string    `json:"event"` // start or stop
	At         time.Time `json:"at"`
}

func openOwnershipLog(path, owner string) (*ownershipLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ownership log: %w", err)
	}
	return &ownershipLog{owner: owner, f: f}, nil
}

// record is projector.RunnerConfig.OnOwnership: start is true before the
// first write of an ownership, false after its last.
func (l *ownershipLog) record(projection string, partition int, start bool) {
	ev := "stop"
	if start {
		ev = "start"
	}
	b, _ := json.Marshal(ownershipRecord{Owner: l.owner, Projection: projection, Partition: partition, Event: ev, At: time.Now().UTC()})
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *ownershipLog) Close() error { return l.f.Close() }
