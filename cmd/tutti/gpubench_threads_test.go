package main

import (
	"strings"
	"testing"
	"time"
)

// The per-thread CPU of this process is read from /proc and a busy thread
// shows up in the delta with its time.
func TestThreadCPUDelta(t *testing.T) {
	before := readThreadCPU()
	if len(before) == 0 {
		t.Skip("no /proc/self/task here")
	}
	for tid, th := range before {
		if tid <= 0 || th.cpu < 0 || th.name == "" {
			t.Fatalf("thread %d: %+v", tid, th)
		}
	}
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	d := threadCPUDelta(before, readThreadCPU(), 0)
	if !strings.Contains(d, "ms") {
		t.Fatalf("100 ms of busy loop left no thread CPU: %q", d)
	}
}
