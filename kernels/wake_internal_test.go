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
	r := &Restorer{cfg: Config{WakeInterval: 100 * time.Microsecond}, ring: ring, kick: make(chan struct{}, 1), stop: make(chan struct{}), helper: newHelperState()}
	r.waker.Add(1)
	go r.wakeLoop()
	r.helper.begin()
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
	r.helper.end()
	close(r.stop)
	r.helper.stop()
	r.waker.Wait()
	r.helper.free()
}

// TestKickLoopSubmitsWhatTheGPUPublishes stands in for the GPU on a ring
// without SQPOLL: it publishes NOP SQEs through the ring's shared memory
// exactly as the I/O kernel does (SQE, SQ array, release-store of the tail),
// and the event-driven helper must submit them so their CQEs appear; while
// nothing is published or in flight it sleeps in the kernel (one enter per
// interval, no spinning).
func TestKickLoopSubmitsWhatTheGPUPublishes(t *testing.T) {
	for _, noMmap := range []bool{false, true} {
		ring, err := uring.New(uring.Config{Entries: 8, SQThreadCPU: -1, NoMmap: noMmap})
		if err != nil {
			t.Skipf("io_uring unavailable: %v", err)
		}
		l := ring.Layout()
		if l.Features&featExtArg == 0 {
			ring.Close()
			t.Skip("kernel without IORING_FEAT_EXT_ARG: the timer loop drives kick mode instead")
		}
		const interval = 20 * time.Millisecond
		r := &Restorer{cfg: Config{WakeInterval: interval}, ring: ring, kick: make(chan struct{}, 1), stop: make(chan struct{}), helper: newHelperState()}
		if m := r.HelperMode(); m != "kick-wait" {
			t.Fatalf("helper mode %q on a ring without SQPOLL, kernel with EXT_ARG", m)
		}
		r.waker.Add(1)
		go r.wakeLoop()
		r.helper.begin()
		r.kick <- struct{}{}

		idle := 200 * time.Millisecond
		w0 := r.Wakeups()
		time.Sleep(idle)
		// A slower machine enters less often, never more: the bound is on spinning.
		if n := r.Wakeups() - w0; n > int64(2*idle/interval)+2 {
			t.Fatalf("noMmap=%v: %d enters in %v idle with a %v interval: the helper spins", noMmap, n, idle, interval)
		}

		mask := ringLoad32(l.SQMask)
		for round := 0; round < 3; round++ { // 12 SQEs through an 8-entry ring: wrap-around
			tail := ringLoad32(l.SQTail)
			for i := uint32(0); i < 4; i++ {
				idx := (tail + i) & mask
				sqe := l.SQEs + uintptr(idx)*uintptr(l.SQESize)
				ringZero(sqe, int(l.SQESize)) // opcode 0 = IORING_OP_NOP
				ringStore64(sqe+32, uint64(100*round)+uint64(i))
				if l.SQArray != 0 {
					ringStore32(l.SQArray+uintptr(idx)*4, idx)
				}
			}
			ringStore32(l.SQTail, tail+4)
			deadline := time.Now().Add(10 * time.Second)
			for ringLoad32(l.CQTail)-ringLoad32(l.CQHead) < 4 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			head, ctail := ringLoad32(l.CQHead), ringLoad32(l.CQTail)
			if ctail-head != 4 {
				t.Fatalf("noMmap=%v round %d: %d CQEs after publishing 4 SQEs", noMmap, round, ctail-head)
			}
			cmask := ringLoad32(l.CQMask)
			for i := uint32(0); i < 4; i++ {
				cqe := l.CQEs + uintptr((head+i)&cmask)*uintptr(l.CQESize)
				ud, res := ringLoad64(cqe), int32(uint32(ringLoad64(cqe+8)))
				if ud != uint64(100*round)+uint64(i) || res != 0 {
					t.Fatalf("noMmap=%v round %d: CQE %d: user data %d res %d", noMmap, round, i, ud, res)
				}
			}
			ringStore32(l.CQHead, head+4)
		}
		if err := r.HelperErr(); err != nil {
			t.Fatalf("kick: %v", err)
		}
		r.helper.end()
		close(r.stop)
		r.helper.stop()
		r.waker.Wait()
		r.helper.free()
		ring.Close()
	}
}
