package kernels

/*
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

// Shared between Go and the C kick loop; off the Go heap.
typedef struct {
	int32_t active;     // restores live; the loop sleeps on this word (futex) while 0
	int32_t stop;       // set once by Close
	int64_t enters;     // io_uring_enter calls made
	int64_t timeouts;   // of which returned on the timeout (ETIME)
	int64_t batch_timeouts; // of those, waits with I/O in flight that ran the whole batch_wait_ns
	int32_t last_errno; // last unexpected io_uring_enter error (0: none)
	int32_t errors;     // how many
	int32_t tid;        // the loop's thread (for per-thread CPU accounting)
	int32_t starts;     // restores begun (the loop resets its idle backoff when it moves)
} tk_kick_ctl;

typedef struct {
	int fd;
	uint32_t sq_entries, cq_entries;
	uint32_t batch;        // most completions one wake-up waits for
	uint32_t exact_target; // !BenchOptions.LooseWakeTarget
	uint32_t ramp;         // Config.WakeRamp: completions per +1 of a restore's starting batch (0: no ramp)
	uint64_t sq_head, sq_tail, cq_head, cq_tail; // addresses in the ring's memory
	int64_t interval_ns;   // wait while nothing is in flight (new SQEs are only seen on waking)
	int64_t batch_wait_ns; // longest wait for a batch while I/O is in flight
} tk_kick_ring;

static inline uint32_t kl_ld(uint64_t a) { return __atomic_load_n((uint32_t *)a, __ATOMIC_ACQUIRE); }

// tk_kick_loop runs until ctl->stop. While a restore is live, each
// io_uring_enter submits exactly the SQEs the GPU has published (asking for
// more than is published makes the kernel skip the wait) and then sleeps in
// the kernel until k completions beyond those the GPU has not reaped yet are
// posted (the kernel's target is head-at-entry + min), or a timeout passes.
//
// k batches the wake-ups: a quarter of the I/O in flight, at most r->batch,
// at least 1. A quarter keeps three quarters of the window at the device
// while the GPU refills the rest; at the tail of a restore k falls to 1, so
// the last reads are not held back. At the start of a restore k ramps up,
// one more for every r->ramp completions: the whole window is in flight at
// once, so k would be a full batch from the first wait, and the first
// layer's last reads would wait for a batch of other layers' completions
// before the GPU could see them (the first layer then arrives later than on
// a CPU-issued restore).
//
// The timeout is batch_wait_ns while I/O is in flight (it bounds how long
// CQEs and newly published SQEs wait when the device is slower than a batch
// per timeout) and interval_ns while nothing is, doubled (up to 8x) for
// every wake-up that found nothing new, so an idle live restore costs
// little; the doubling starts over when a restore begins (ctl->starts), so
// a restore's first SQEs wait at most one interval. On a ring with
// DEFER_TASKRUN the kernel wakes this thread only when k completions are
// pending, which is what makes the batch save CPU; on other rings each
// completion's task work still wakes it inside the wait (but it returns to
// user space once per batch).
// While no restore is live it sleeps on ctl->active (futex, re-checked every
// 100 ms).
static void tk_kick_loop(tk_kick_ctl *ctl, const tk_kick_ring *r) {
	struct { int64_t sec, nsec; } ts;
	struct { uint64_t sigmask; uint32_t sigmask_sz, min_wait_usec; uint64_t ts; } arg = { 0, 0, 0, (uint64_t)(uintptr_t)&ts };
	struct timespec idle = { 0, 100000000 };
	struct timespec back = { r->interval_ns / 1000000000, r->interval_ns % 1000000000 };
	uint32_t submitted = 0, posted0 = kl_ld(r->cq_tail), last_sq = kl_ld(r->sq_tail), backoff = 0, lag = 0;
	int32_t starts = 0;
	uint32_t start_tail = 0, ramping = 0;
	__atomic_store_n(&ctl->tid, (int32_t)syscall(SYS_gettid), __ATOMIC_RELAXED);
	for (;;) {
		if (__atomic_load_n(&ctl->stop, __ATOMIC_ACQUIRE)) return;
		if (__atomic_load_n(&ctl->active, __ATOMIC_ACQUIRE) == 0) {
			syscall(SYS_futex, &ctl->active, FUTEX_WAIT_PRIVATE, 0, &idle, NULL, 0);
			continue;
		}
		int32_t st = __atomic_load_n(&ctl->starts, __ATOMIC_ACQUIRE);
		if (st != starts) {
			// A restore began: its first SQEs must not wait out a backoff
			// grown while the ring was idle.
			starts = st;
			backoff = 0;
			last_sq = kl_ld(r->sq_tail) - 1; // not "nothing new": the first idle wait is one interval
			start_tail = kl_ld(r->cq_tail);
			ramping = r->ramp != 0;
		}
		uint32_t ctail = kl_ld(r->cq_tail), chead = kl_ld(r->cq_head);
		uint32_t sqt = kl_ld(r->sq_tail);
		uint32_t tosub = sqt - kl_ld(r->sq_head);
		if (tosub > r->sq_entries) tosub = r->sq_entries;
		uint32_t inflight = submitted - (ctail - posted0);
		if (inflight > r->cq_entries) inflight = 0; // CQEs not of ours (cannot happen on a dedicated ring)
		uint32_t after = inflight + tosub;
		uint32_t k = after / 4;
		if (k > r->batch) k = r->batch;
		if (ramping) {
			uint32_t cap = 1 + (ctail - start_tail) / r->ramp;
			if (cap >= r->batch) ramping = 0;
			else if (k > cap) k = cap;
		}
		if (k == 0) k = 1;
		int64_t wait_ns;
		if (after > 0) {
			wait_ns = r->batch_wait_ns;
			backoff = 0;
		} else {
			if (sqt == last_sq && backoff < 3) backoff++;
			wait_ns = r->interval_ns << backoff;
		}
		last_sq = sqt;
		ts.sec = wait_ns / 1000000000;
		ts.nsec = wait_ns % 1000000000;
		// The kernel's target is the CQ head it reads + minc, and the GPU
		// moves the head: it reaps what the last wait posted while this
		// thread computes minc. Counting the unreaped CQEs can then ask for
		// more completions than are in flight, and the wait runs to its
		// timeout. With exact_target they are counted only while the GPU is
		// seen not to reap (lag: the last call returned at once with nothing
		// new posted and CQEs unreaped), and a wait for one completion
		// times out after 4 intervals, not the batch wait.
		uint32_t unreaped = ctail - chead;
		if (unreaped == 0) lag = 0;
		uint32_t minc = k + ((r->exact_target && !lag) ? 0 : unreaped);
		if (minc > r->cq_entries) minc = r->cq_entries;
		if (r->exact_target && k == 1 && after > 0 && wait_ns > 4 * r->interval_ns) {
			wait_ns = 4 * r->interval_ns;
			ts.sec = wait_ns / 1000000000;
			ts.nsec = wait_ns % 1000000000;
		}
		long rc = syscall(SYS_io_uring_enter, r->fd, tosub, minc, 1u | 8u, &arg, sizeof arg); // GETEVENTS | EXT_ARG
		__atomic_add_fetch(&ctl->enters, 1, __ATOMIC_RELAXED);
		if (r->exact_target) lag = rc >= 0 && unreaped > 0 && kl_ld(r->cq_tail) == ctail;
		if (rc > 0) submitted += (uint32_t)rc;
		if (rc < 0 && errno == ETIME) {
			__atomic_add_fetch(&ctl->timeouts, 1, __ATOMIC_RELAXED);
			if (after > 0 && wait_ns == r->batch_wait_ns) __atomic_add_fetch(&ctl->batch_timeouts, 1, __ATOMIC_RELAXED);
		}
		if (rc < 0 && errno != ETIME && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
			__atomic_store_n(&ctl->last_errno, errno, __ATOMIC_RELAXED);
			__atomic_add_fetch(&ctl->errors, 1, __ATOMIC_RELAXED);
			nanosleep(&back, NULL); // a persistent error is retried once per interval, not spun on
		}
	}
}

static void tk_kick_wake(tk_kick_ctl *ctl) { syscall(SYS_futex, &ctl->active, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tutti-io/tutti/uring"
)

// helperState is what the CPU helper of a GPU ring shares with the rest of
// the Restorer, in C memory so that the kick loop (C, one cgo call for its
// whole life) can sleep on it. Allocated by newHelperState, freed by free
// after the helper returned.
type helperState struct {
	ctl *C.tk_kick_ctl
}

func newHelperState() helperState {
	return helperState{ctl: (*C.tk_kick_ctl)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tk_kick_ctl{}))))}
}

func (h helperState) free() { C.free(unsafe.Pointer(h.ctl)) }

func (h helperState) activeWord() *atomic.Int32 {
	return (*atomic.Int32)(unsafe.Pointer(&h.ctl.active))
}

// begin counts a restore live and reports whether it is the only one (the
// helper may be asleep: the caller wakes it).
func (h helperState) begin() bool {
	(*atomic.Int32)(unsafe.Pointer(&h.ctl.starts)).Add(1)
	if h.activeWord().Add(1) == 1 {
		C.tk_kick_wake(h.ctl)
		return true
	}
	return false
}

func (h helperState) end()         { h.activeWord().Add(-1) }
func (h helperState) active() bool { return h.activeWord().Load() != 0 }

func (h helperState) stop() {
	atomic.StoreInt32((*int32)(unsafe.Pointer(&h.ctl.stop)), 1)
	C.tk_kick_wake(h.ctl)
}

func (h helperState) tid() int { return int(atomic.LoadInt32((*int32)(unsafe.Pointer(&h.ctl.tid)))) }

func (h helperState) enters() int64 { return atomic.LoadInt64((*int64)(unsafe.Pointer(&h.ctl.enters))) }

func (h helperState) timeouts() int64 {
	return atomic.LoadInt64((*int64)(unsafe.Pointer(&h.ctl.timeouts)))
}

func (h helperState) batchTimeouts() int64 {
	return atomic.LoadInt64((*int64)(unsafe.Pointer(&h.ctl.batch_timeouts)))
}

// err is the last unexpected io_uring_enter error of the kick loop.
func (h helperState) err() error {
	n := atomic.LoadInt32((*int32)(unsafe.Pointer(&h.ctl.errors)))
	if n == 0 {
		return nil
	}
	e := syscall.Errno(atomic.LoadInt32((*int32)(unsafe.Pointer(&h.ctl.last_errno))))
	return fmt.Errorf("io_uring_enter (kick): %d errors, last: %w", n, e)
}

// runKickLoop runs the C kick loop on the calling (locked) OS thread until
// stop. One cgo call for the loop's whole life: the Go scheduler hands the
// thread's P off once, instead of on every wait as a Go loop of blocking
// io_uring_enter calls did (a handoff's CPU on every wake-up).
func (h helperState) runKickLoop(l uring.RingLayout, interval, batchWait time.Duration, batch, ramp int, exact bool) {
	kr := (*C.tk_kick_ring)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tk_kick_ring{}))))
	defer C.free(unsafe.Pointer(kr))
	kr.fd = C.int(l.FD)
	kr.sq_entries = C.uint32_t(l.SQEntries)
	kr.cq_entries = C.uint32_t(l.CQEntries)
	kr.sq_head = C.uint64_t(l.SQHead)
	kr.sq_tail = C.uint64_t(l.SQTail)
	kr.cq_head = C.uint64_t(l.CQHead)
	kr.cq_tail = C.uint64_t(l.CQTail)
	kr.interval_ns = C.int64_t(interval.Nanoseconds())
	kr.batch_wait_ns = C.int64_t(batchWait.Nanoseconds())
	kr.batch = C.uint32_t(batch)
	kr.ramp = C.uint32_t(max(ramp, 0))
	if exact {
		kr.exact_target = 1
	}
	C.tk_kick_loop(h.ctl, kr)
}
