package gpubench

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

// ioWQDelta counts the io-wq workers that ran, and only them.
func TestIOWQDelta(t *testing.T) {
	th := func(name string, ms int) struct {
		name string
		cpu  time.Duration
	} {
		return struct {
			name string
			cpu  time.Duration
		}{name, time.Duration(ms) * time.Millisecond}
	}
	before := threadCPU{1: th("tutti", 10), 2: th("iou-wrk-1", 5), 3: th("iou-wrk-1", 7), 9: th("iou-wrk-1", 1)}
	for _, tc := range []struct {
		name    string
		after   threadCPU
		workers int
		cpu     time.Duration
	}{
		{"none ran", threadCPU{1: th("tutti", 50), 2: th("iou-wrk-1", 5), 3: th("iou-wrk-1", 7)}, 0, 0},
		{"two ran, one new", threadCPU{1: th("tutti", 50), 2: th("iou-wrk-1", 8), 3: th("iou-wrk-1", 7), 4: th("iou-wrk-1", 2)}, 2, 5 * time.Millisecond},
		{"the SQPOLL thread is not a worker", threadCPU{5: th("iou-sqp-1", 40)}, 0, 0},
		{"an exited worker is not counted", threadCPU{1: th("tutti", 11)}, 0, 0},
	} {
		n, cpu := ioWQDelta(before, tc.after)
		if n != tc.workers || cpu != tc.cpu {
			t.Errorf("%s: %d workers, %v; want %d, %v", tc.name, n, cpu, tc.workers, tc.cpu)
		}
	}
}
