package uring

import "golang.org/x/sys/unix"

// Engines outside this package (the seeded simulator in uring/uringsim)
// drive a Completion through the methods below, so that they check, retry,
// continue and fail ops by the same rules as the Ring.

// MaxIORetries bounds the EINTR/EAGAIN resubmissions of one I/O (Apply's rule).
const MaxIORetries = maxIORetries

// Validate checks a prepared completion as Submit does: the same rules for
// every engine, so a simulator rejects what the ring would.
func (c *Completion) Validate() error { return c.validate() }

// OpError wraps err with c's op, file, offset and length.
func (c *Completion) OpError(err error) error { return c.opError(err) }

// Remaining is the bytes c has still to transfer (0 for a NOP or a sync).
func (c *Completion) Remaining() uint32 { return c.length - c.progress }

// Buffer returns the registered buffer of a fixed op and its index.
func (c *Completion) Buffer() (*Buffer, uint16) { return c.buf, c.bufIndex }

// Apply applies one kernel-style result (bytes, or -errno) to c. It reports
// whether c is finished (Result and Err set); false means c must be
// submitted again, for the rest after a short transfer or after EINTR/EAGAIN
// (at most MaxIORetries times).
func (c *Completion) Apply(res int32, st *Stats) bool { return applyResult(c, res, st) }

// Abort finishes c with err (wrapped by OpError) and the bytes done so far,
// as an engine does with the I/O in flight when it stops.
func (c *Completion) Abort(err error) {
	c.restoreIov()
	c.Result, c.Err = int64(c.progress), c.opError(err)
}

// Perform does the next attempt of c synchronously: at most limit bytes of
// what remains, through pread/pwrite (entry by entry for vectored ops) or
// fsync/fdatasync on c's file. It returns what a CQE would (bytes, or
// -errno) and does not advance c: Apply does.
func (c *Completion) Perform(limit uint32) int32 {
	limit = min(limit, c.Remaining())
	var n int
	var err error
	switch c.op {
	case OpNop:
		return 0
	case OpFsync:
		err = unix.Fsync(int(c.file.FD))
	case OpFdatasync:
		err = unix.Fdatasync(int(c.file.FD))
	case OpRead, OpReadFixed:
		addr, _, off := c.cur()
		n, err = sysPread(c.file.FD, addr, limit, off)
	case OpWrite, OpWriteFixed:
		addr, _, off := c.cur()
		n, err = sysPwrite(c.file.FD, addr, limit, off)
	case OpReadv, OpWritev:
		n, err = c.performVectored(limit)
	}
	if err != nil {
		if errno, ok := err.(unix.Errno); ok {
			return -int32(errno)
		}
		return -int32(unix.EIO)
	}
	return int32(n)
}

// performVectored transfers up to limit bytes of a vectored op entry by
// entry, stopping at the first short entry; an error after some bytes
// reports the bytes (the next attempt meets the error again).
func (c *Completion) performVectored(limit uint32) (int, error) {
	total := 0
	off := c.offset + uint64(c.progress)
	for i := c.iovStart; i < c.iov.n && uint32(total) < limit; i++ {
		e := c.iov.vec[i]
		n := uint32(min(e.Len, uint64(limit-uint32(total))))
		var got int
		var err error
		if c.op == OpReadv {
			got, err = sysPread(c.file.FD, uintptr(e.Base), n, off)
		} else {
			got, err = sysPwrite(c.file.FD, uintptr(e.Base), n, off)
		}
		if err != nil {
			if total > 0 {
				return total, nil
			}
			return 0, err
		}
		total += got
		off += uint64(got)
		if uint32(got) < n {
			break
		}
	}
	return total, nil
}

// Deliver runs the callbacks of cs in order, as Flush does after a batch.
// A callback may Submit again.
func Deliver(cs []*Completion) {
	for _, c := range cs {
		if c.Callback != nil {
			c.Callback(c)
		}
	}
}
