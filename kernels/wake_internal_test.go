package kernels

import (
	"testing"
	"time"

	"github.com/tutti-io/tutti/uring"
)

// TestWakeLoopKicks: on a ring without SQPOLL the helper enters the kernel
// while a restore is live, and stops when none is (no GPU needed).
func TestWakeLoopKicks(t *testing.T) {
	ring, err := uring.New(uring.Config{Entries: 8, SQThreadCPU: -1})
	if err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	defer ring.Close()
	r := &Restorer{cfg: Config{WakeInterval: 100 * time.Microsecond}, ring: ring, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	r.waker.Add(1)
	go r.wakeLoop()
	r.active.Add(1)
	r.kick <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for r.Wakeups() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if r.Wakeups() < 3 {
		t.Fatalf("%d kicks while a restore was live", r.Wakeups())
	}
	if e := r.wakeErr.Load(); e != nil {
		t.Fatalf("kick: %v", *e)
	}
	r.active.Add(-1)
	close(r.stop)
	r.waker.Wait()
}
