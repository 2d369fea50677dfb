package kernels

import (
	"fmt"
	"runtime"
	"time"

	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// wakeLoop is the CPU helper of the GPU ring: while a restore is live it looks
// at the SQPOLL thread's flags every WakeInterval and enters the kernel only
// when the thread sleeps (IORING_SQ_NEED_WAKEUP), so the per-I/O path stays on
// the GPU.
//
// A ring without SQPOLL is driven in kick mode instead: by the C loop of
// kickloop.go (runKickLoop), woken by completions, or, on a kernel without
// IORING_FEAT_EXT_ARG, by this loop entering the kernel once per interval.
//
// ready receives nil once the helper runs, or why it cannot (then it has
// returned). A ring created disabled is set up here, on the helper's locked
// thread: the staging pool is registered, the ring enabled (this thread
// becomes its single issuer) and, when the helper stops, unregistered.
func (r *Restorer) wakeLoop(slotBytes int64, ready chan<- error) {
	defer r.waker.Done()
	l := r.ring.Layout()
	kick := l.SetupFlags&setupSQPoll == 0
	if kick || r.owned {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	if r.owned {
		if !r.opts.NoFixedBuffers {
			r.fixedErr = r.registerStaging(slotBytes)
			r.fixed = r.fixedErr == nil
		}
		if err := r.ring.Enable(); err != nil {
			if r.fixed {
				r.ring.RegisterBuffers(nil)
			}
			ready <- fmt.Errorf("enabling the GPU ring on the helper thread: %w", err)
			return
		}
		defer func() {
			if r.fixed {
				// The pages stay pinned by the ring until unregistered, and
				// only this thread may unregister them.
				r.unregErr = r.ring.RegisterBuffers(nil)
			}
		}()
	}
	ready <- nil
	if kick && l.Features&featExtArg != 0 {
		r.helper.runKickLoop(l, r.cfg.WakeInterval, r.cfg.BatchWait, r.cfg.WakeBatch, r.cfg.WakeRamp, !r.opts.LooseWakeTarget)
		return
	}
	t := time.NewTicker(r.cfg.WakeInterval)
	defer t.Stop()
	for {
		if !r.helper.active() {
			select {
			case <-r.kick:
			case <-r.stop:
				return
			}
		}
		var woke bool
		var err error
		if kick {
			woke, err = true, enter(l.FD, l.SQEntries, l.EnterGetEvents)
		} else {
			woke, err = r.ring.WakeIfNeeded()
		}
		if err != nil {
			r.wakeErr.Store(&err)
		}
		if woke {
			r.wakes.Add(1)
		}
		select {
		case <-t.C:
		case <-r.stop:
			return
		}
	}
}

const (
	setupSQPoll       = 1 << 1  // IORING_SETUP_SQPOLL
	setupRDisabled    = 1 << 6  // IORING_SETUP_R_DISABLED
	setupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN
	featExtArg        = 1 << 8  // IORING_FEAT_EXT_ARG: io_uring_enter takes a wait timeout
)

func enter(fd int, toSubmit, flags uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit), 0, uintptr(flags), 0, 0)
	if e != 0 && e != unix.EINTR && e != unix.EAGAIN && e != unix.EBUSY {
		return fmt.Errorf("io_uring_enter (kick): %w", e)
	}
	return nil
}

// registerStaging registers each staging slot with the ring as fixed buffer
// number slot. Nothing is in flight on the ring yet (Bind owns it).
func (r *Restorer) registerStaging(slotBytes int64) error {
	n := r.cfg.StagingSlots
	if n > 1<<16 {
		return fmt.Errorf("registering %d staging slots as fixed buffers: more than the SQE's 16-bit buffer index: %w", n, ErrInvalid)
	}
	views := make([]*uring.Buffer, n)
	for i := range views {
		v, err := r.staging.View(i*int(slotBytes), int(slotBytes))
		if err != nil {
			return fmt.Errorf("registering staging slot %d as a fixed buffer: %w", i, err)
		}
		views[i] = v
	}
	if err := r.ring.RegisterBuffers(views); err != nil {
		return fmt.Errorf("registering %d staging slots of %d bytes as fixed buffers: %w", n, slotBytes, err)
	}
	return nil
}

// FixedBuffers reports whether the GPU issues READ_FIXED into registered
// staging slots, and if it does not although asked to, why (the restore
// then runs with plain reads: slower on the CPU, the same bytes).
func (r *Restorer) FixedBuffers() (bool, error) { return r.fixed, r.fixedErr }

// Wakeups counts the times the helper had to wake the SQPOLL thread (or, in
// kick mode, entered the kernel).
func (r *Restorer) Wakeups() int64 { return r.wakes.Load() + r.helper.enters() }

// WakeTimeouts counts the kick loop's waits that ended on their timeout
// rather than on a batch of completions (part of Wakeups).
func (r *Restorer) WakeTimeouts() int64 { return r.helper.timeouts() }

// BatchTimeouts counts the kick loop's waits that ran the whole BatchWait
// with I/O in flight (part of WakeTimeouts; the rest are idle waits and,
// without BenchOptions.LooseWakeTarget, short waits for a single completion).
func (r *Restorer) BatchTimeouts() int64 { return r.helper.batchTimeouts() }

// HelperMode says how the CPU helper drives the ring: "sqpoll-wake" (it
// only wakes the SQPOLL thread), "kick-wait" (the C loop, woken by
// completions) or "kick-timer" (a kernel without IORING_FEAT_EXT_ARG: one
// io_uring_enter per WakeInterval, more CPU; reported, never silent).
func (r *Restorer) HelperMode() string {
	if r.ring == nil {
		return ""
	}
	l := r.ring.Layout()
	switch {
	case l.SetupFlags&setupSQPoll != 0:
		return "sqpoll-wake"
	case l.Features&featExtArg != 0 && l.SetupFlags&setupDeferTaskrun != 0:
		return "kick-wait, deferred task work"
	case l.Features&featExtArg != 0:
		return "kick-wait"
	}
	return "kick-timer"
}

// HelperTID is the OS thread id of the kick loop (0 before it started, or
// on a SQPOLL ring): its CPU time is the helper's share of the process's.
func (r *Restorer) HelperTID() int { return r.helper.tid() }

// HelperErr is the last error of the CPU helper's io_uring_enter calls (nil
// if none). The GPU sees such a failure only as entries that time out; this
// says why.
func (r *Restorer) HelperErr() error {
	if err := r.helper.err(); err != nil {
		return err
	}
	if e := r.wakeErr.Load(); e != nil {
		return *e
	}
	return nil
}
