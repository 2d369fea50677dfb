package uring

import (
	"fmt"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Submitting, flushing and reaping: the Ring's Engine loop.

// Submit implements Engine.
func (r *Ring) Submit(c *Completion) error {
	if r.closed {
		return fmt.Errorf("uring: submit %s: %w", c.op, ErrClosed)
	}
	if err := c.validate(); err != nil {
		return err
	}
	if err := opSupported(c.op); err != nil {
		return err
	}
	if (c.op == OpReadFixed || c.op == OpWriteFixed) && (int(c.bufIndex) >= len(r.bufs) || r.bufs[c.bufIndex] != c.buf) {
		return fmt.Errorf("uring: %s %s: %w: buffer index %d is not that buffer's registration on this ring", c.op, c.file.Path, ErrInvalid, c.bufIndex)
	}
	r.overflow.push(c)
	if r.inKernel >= r.cfg.MaxInFlight || r.sqFree() == 0 {
		r.stats.Overflowed++
	}
	r.fill()
	if r.cfg.SQPoll {
		if _, err := r.WakeIfNeeded(); err != nil {
			return err
		}
	}
	return nil
}

func (r *Ring) sqFree() uint32 {
	return r.p.SQEntries - (r.sqLocalTail - atomic.LoadUint32(r.sqHead))
}

// fill moves completions from the overflow queue into free SQEs, bounded by
// MaxInFlight, and publishes the new tail.
func (r *Ring) fill() {
	free := r.sqFree()
	moved := false
	for free > 0 && r.inKernel < r.cfg.MaxInFlight && r.overflow.head != nil {
		c := r.overflow.pop()
		slot := r.freeSlot[len(r.freeSlot)-1]
		r.freeSlot = r.freeSlot[:len(r.freeSlot)-1]
		r.slots[slot] = c
		r.prep(&r.sqes[r.sqLocalTail&r.sqMask], c, slot)
		r.sqLocalTail++
		r.toSubmit++
		r.inKernel++
		r.stats.Submitted++
		free--
		moved = true
	}
	if moved {
		// Release store; on amd64 an XCHG, i.e. also the full fence SQPOLL's
		// NEED_WAKEUP check after it requires.
		atomic.StoreUint32(r.sqTail, r.sqLocalTail)
	}
}

func (r *Ring) prep(s *sqe, c *Completion, slot uint32) {
	*s = sqe{UserData: uint64(slot)}
	if c.file != nil {
		if i := c.file.Index; i >= 0 && int(i) < len(r.files) && r.files[i] == c.file {
			s.FD = c.file.Index
			s.Flags |= sqeFixedFile
		} else {
			s.FD = c.file.FD
		}
	}
	switch c.op {
	case OpNop:
		s.Opcode = opNop
		s.FD = -1
	case OpRead, OpWrite, OpReadFixed, OpWriteFixed:
		addr, n, off := c.cur()
		s.Addr, s.Len, s.Off = uint64(addr), n, off
		s.Opcode = map4(c.op)
		s.BufIndex = c.bufIndex
	case OpReadv, OpWritev:
		s.Opcode = opReadv
		if c.op == OpWritev {
			s.Opcode = opWritev
		}
		s.Addr = uint64(c.iov.entryAddr(c.iovStart))
		s.Len = uint32(c.iov.n - c.iovStart)
		s.Off = c.offset + uint64(c.progress)
	case OpFsync:
		s.Opcode = opFsync
	case OpFdatasync:
		s.Opcode = opFsync
		s.OpFlags = fsyncDatasync
	}
}

func map4(o Op) uint8 {
	switch o {
	case OpRead:
		return opRead
	case OpWrite:
		return opWrite
	case OpReadFixed:
		return opReadFixed
	default:
		return opWriteFixed
	}
}

// WakeIfNeeded wakes the SQPOLL thread with io_uring_enter(SQ_WAKEUP) if,
// and only if, the kernel set IORING_SQ_NEED_WAKEUP. It reports whether it
// did. Without SQPoll it does nothing.
func (r *Ring) WakeIfNeeded() (bool, error) {
	if !r.cfg.SQPoll || r.closed {
		return false, nil
	}
	if atomic.LoadUint32(r.sqFlags)&sqNeedWakeup == 0 {
		return false, nil
	}
	for i := 0; ; i++ {
		r.stats.Enters++
		_, err := sysEnter(r.fd, 0, 0, enterSQWakeup)
		if err == nil {
			r.stats.Wakeups++
			return true, nil
		}
		if (err == unix.EINTR || err == unix.EAGAIN) && i < maxEnterRetries {
			r.stats.EnterRetries++
			continue
		}
		return false, fmt.Errorf("uring: waking SQPOLL thread: %w", err)
	}
}

// Flush implements Engine.
func (r *Ring) Flush(waitNr int) error {
	if r.closed {
		return fmt.Errorf("uring: flush: %w", ErrClosed)
	}
	target := min(waitNr, r.InFlight())
	delivered := 0
	enterFails, stalls := 0, 0
	for pass := 0; ; pass++ {
		r.fill()
		delivered += r.reap()
		r.fill()
		need := target - delivered
		var flags, minC uint32
		submit := r.toSubmit
		if r.cfg.SQPoll {
			submit = 0
			if atomic.LoadUint32(r.sqFlags)&sqNeedWakeup != 0 && r.inKernel > 0 {
				flags |= enterSQWakeup
			}
		}
		if need > 0 && r.inKernel == 0 {
			// Everything wanted is still in the overflow queue because the
			// SQ looks full: with SQPOLL the kernel posts CQEs before it
			// commits the SQ head, so the space appears shortly. Waiting in
			// the kernel would wait for nothing; yield and retry (bounded).
			if submit == 0 && flags == 0 {
				stalls++
				if stalls > maxSQStalls {
					return fmt.Errorf("uring: flush: SQ head did not advance after %d polls (%d queued, SQ free %d)", stalls, r.overflow.n, r.sqFree())
				}
				runtime.Gosched()
				continue
			}
		} else if need > 0 {
			flags |= enterGetEvents
			minC = uint32(min(need, r.inKernel))
		} else if r.inKernel > 0 && (r.cfg.DeferTaskrun || (r.cfg.CoopTaskrun && atomic.LoadUint32(r.sqFlags)&sqTaskrun != 0)) {
			// Completions are posted only when this task enters the kernel.
			flags |= enterGetEvents
		}
		if submit == 0 && flags == 0 {
			break
		}
		if need <= 0 && pass > 0 && submit == 0 {
			break
		}
		r.stats.Enters++
		n, err := sysEnter(r.fd, submit, minC, flags)
		if flags&enterSQWakeup != 0 && err == nil {
			r.stats.Wakeups++
		}
		if err != nil {
			switch err {
			case unix.EINTR, unix.EAGAIN, unix.EBUSY:
				// EBUSY/EAGAIN: the kernel needs completions reaped first;
				// the next pass reaps them.
				r.stats.EnterRetries++
				enterFails++
				if enterFails > maxEnterRetries {
					return fmt.Errorf("uring: flush: io_uring_enter failed %d times in a row: %w", enterFails, err)
				}
				continue
			case unix.EEXIST:
				return fmt.Errorf("uring: flush: io_uring_enter: %w (SingleIssuer ring used from another OS thread: lock the owning goroutine with runtime.LockOSThread before New)", err)
			default:
				return fmt.Errorf("uring: flush: io_uring_enter: %w", err)
			}
		}
		enterFails = 0
		if !r.cfg.SQPoll && n > 0 {
			r.toSubmit -= uint32(min(n, int(r.toSubmit)))
		}
		delivered += r.reap()
		if delivered >= target && r.toSubmit == 0 && (r.overflow.head == nil || r.inKernel >= r.cfg.MaxInFlight || r.sqFree() == 0) {
			break
		}
		if pass > 4*maxEnterRetries+maxSQStalls {
			return fmt.Errorf("uring: flush: no progress after %d passes (%d of %d delivered)", pass, delivered, target)
		}
	}
	runCallbacks(r.done.take())
	return nil
}

// reap consumes every CQE available, in one batch, and returns how many
// completions were finished (continuations and retries go back to the
// overflow queue and are not counted).
func (r *Ring) reap() int {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	finished := 0
	for ; head != tail; head++ {
		e := &r.cqes[head&r.cqMask]
		slot := uint32(e.UserData)
		res := e.Res
		c := r.slots[slot]
		r.slots[slot] = nil
		r.freeSlot = append(r.freeSlot, slot)
		r.inKernel--
		if r.complete(c, res) {
			finished++
		}
	}
	atomic.StoreUint32(r.cqHead, head)
	return finished
}

// complete applies one CQE result to c; it reports whether c is finished
// (queued for its callback). Unfinished completions (continuation, retry)
// go back to the front of the overflow queue.
func (r *Ring) complete(c *Completion, res int32) bool {
	if applyResult(c, res, &r.stats) {
		r.finish(c)
		return true
	}
	r.overflow.pushFront(c)
	return false
}

func (r *Ring) finish(c *Completion) {
	r.stats.Completed++
	r.done.push(c)
}
