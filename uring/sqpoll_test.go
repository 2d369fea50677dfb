package uring

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func rusageSelf(t *testing.T) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSQPollCPUTimeInRusage answers whether getrusage(RUSAGE_SELF) already
// counts the iou-sqp thread (so devbench must not add it twice). The thread
// busy-polls for sq_thread_idle after the last submission while this
// goroutine sleeps; its CPU time must show up in the process's rusage.
func TestSQPollCPUTimeInRusage(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 8, SQThreadCPU: -1, SQPoll: true, SQThreadIdleMs: 400})
	if r.SQPollTID() < 0 {
		t.Fatal("iou-sqp thread not found under /proc/self/task")
	}
	t0, err := r.SQPollCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	ru0 := rusageSelf(t)
	var c Completion
	c.PrepNop()
	run1(t, r, &c)
	time.Sleep(300 * time.Millisecond)
	t1, err := r.SQPollCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	ru1 := rusageSelf(t)
	sq, ru := t1-t0, ru1-ru0
	t.Logf("iou-sqp thread %v, rusage(self) %v over 300 ms", sq, ru)
	if sq < 50*time.Millisecond {
		t.Skipf("the SQPOLL thread got only %v of CPU (machine busy); cannot tell", sq)
	}
	if ru < sq/2 {
		t.Fatalf("rusage(self) %v does not include the iou-sqp thread's %v: devbench must add it", ru, sq)
	}
}

// TestSQPollTinyRingResubmit: with SQPOLL the kernel posts a CQE before it
// releases the SQ slot, so a callback that resubmits can find the SQ full
// with nothing in the kernel. Flush must not wait in the kernel then (it
// used to hang forever).
func TestSQPollTinyRingResubmit(t *testing.T) {
	r := newRingOrSkip(t, Config{Entries: 1, SQThreadCPU: -1, SQPoll: true, SQThreadIdleMs: 50})
	f, _ := directFile(t, t.TempDir(), 4096, 8)
	buf := mustBuffer(t, 4096)
	const n = 10000
	left := n
	var c Completion
	var cb func(*Completion)
	cb = func(c *Completion) {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		if left--; left > 0 {
			if left%2 == 0 {
				c.PrepNop()
			} else {
				c.PrepRead(f, buf.Addr(), 4096, 0)
			}
			c.Callback = cb
			if err := r.Submit(c); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.PrepNop()
	c.Callback = cb
	if err := r.Submit(&c); err != nil {
		t.Fatal(err)
	}
	for r.InFlight() > 0 {
		if err := r.Flush(1); err != nil {
			t.Fatal(err)
		}
	}
	if left != 0 {
		t.Fatalf("%d ops left", left)
	}
	t.Logf("stats %+v", r.Stats())
}

func TestParseStatCPU(t *testing.T) {
	line := "1234 (iou-sqp-1) S 1 1234 1234 0 -1 4194368 0 0 0 0 150 25 0 0 20 0 1 0 100 0 0"
	d, err := parseStatCPU(line)
	if err != nil || d != 1750*time.Millisecond {
		t.Fatalf("%v %v, want 1.75s", d, err)
	}
	if _, err := parseStatCPU("1234 (a) b) S 1"); err == nil {
		t.Fatal("short line accepted")
	}
}

func FuzzParseStatCPU(f *testing.F) {
	f.Add("1234 (iou-sqp-1) S 1 1234 1234 0 -1 4194368 0 0 0 0 150 25 0 0 20 0 1 0 100 0 0")
	f.Add("1 (x) y) R 0 0 0 0 0 0 0 0 0 0 18446744073709551615 1")
	f.Add(")")
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseStatCPU(s)
		if err == nil && d < 0 {
			t.Fatalf("negative CPU time %v from %q", d, s)
		}
	})
}
