package uring

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// Sentinel errors; callers branch with errors.Is.
var (
	ErrNotSupported = errors.New("not supported by this kernel")
	ErrMisaligned   = errors.New("misaligned for O_DIRECT")
	ErrClosed       = errors.New("closed")
	ErrCrashed      = errors.New("simulated crash")
	ErrInvalid      = errors.New("invalid request")
)

// Op is the operation a Completion carries.
type Op uint8

// Operations of the engine.
const (
	OpNop Op = iota
	OpRead
	OpWrite
	OpReadFixed
	OpWriteFixed
	OpReadv
	OpWritev
	OpFsync
	OpFdatasync
)

var opNames = [...]string{"nop", "read", "write", "read_fixed", "write_fixed", "readv", "writev", "fsync", "fdatasync"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// IsRead reports whether the op moves data from the file into memory.
func (o Op) IsRead() bool { return o == OpRead || o == OpReadFixed || o == OpReadv }

// IsWrite reports whether the op moves data from memory into the file.
func (o Op) IsWrite() bool { return o == OpWrite || o == OpWriteFixed || o == OpWritev }

// Completion is one I/O, owned by the caller: allocate them in arrays or
// pools, one per in-flight I/O. Between Submit and the start of its Callback
// the engine owns it and the caller must not touch it (nor the memory it
// points to). No allocation and no channel is made per I/O.
//
// Result in the callback: the total bytes transferred (short transfers are
// continued by the engine until done, an error, or end of file — a read that
// reaches EOF completes with Result < requested and Err == nil), or 0 for
// fsync/fdatasync/nop. Err is nil or wraps the errno (errors.Is(err,
// unix.EIO)) and names the op, file and offset; on error Result holds the
// bytes transferred before it.
type Completion struct {
	Context  any               // the caller's; untouched by the engine
	UserData uint64            // the caller's; untouched by the engine
	Callback func(*Completion) // runs on the goroutine calling Flush, after the whole batch was reaped; may Submit
	Result   int64
	Err      error

	op       Op
	file     *File
	buf      *Buffer
	iov      *Iovecs
	addr     uintptr
	length   uint32
	offset   uint64
	bufIndex uint16

	progress uint32 // bytes done so far (short-transfer continuation)
	retries  uint8  // EINTR/EAGAIN resubmissions
	// Vectored continuation: entries before iovStart are done; iovSaved holds
	// the original of entry iovStart when it was partly consumed.
	iovStart    int
	iovSavedLen uint64
	iovSavedOK  bool

	next *Completion // intrusive list link (overflow queue, done list)
}

// Op returns the prepared operation.
func (c *Completion) Op() Op { return c.op }

// File returns the prepared file.
func (c *Completion) File() *File { return c.file }

// Offset returns the prepared file offset.
func (c *Completion) Offset() uint64 { return c.offset }

// Len returns the prepared length (total of the iovecs for vectored ops).
func (c *Completion) Len() uint32 { return c.length }

func (c *Completion) reset(op Op, f *File) {
	c.op, c.file, c.buf, c.iov = op, f, nil, nil
	c.addr, c.length, c.offset, c.bufIndex = 0, 0, 0, 0
	c.progress, c.retries, c.iovStart, c.iovSavedLen, c.iovSavedOK = 0, 0, 0, 0, false
	c.Result, c.Err, c.next = 0, nil, nil
}

// PrepNop prepares a no-op (useful to measure the ring itself).
func (c *Completion) PrepNop() { c.reset(OpNop, nil) }

// PrepRead prepares a read of lenBytes at offset into off-heap memory at addr.
func (c *Completion) PrepRead(f *File, addr uintptr, lenBytes uint32, offset uint64) {
	c.reset(OpRead, f)
	c.addr, c.length, c.offset = addr, lenBytes, offset
}

// PrepWrite prepares a write of lenBytes at offset from off-heap memory at addr.
func (c *Completion) PrepWrite(f *File, addr uintptr, lenBytes uint32, offset uint64) {
	c.reset(OpWrite, f)
	c.addr, c.length, c.offset = addr, lenBytes, offset
}

// PrepReadFixed prepares a read into registered buffer bufIndex (buf), at
// addr inside it.
func (c *Completion) PrepReadFixed(f *File, buf *Buffer, bufIndex uint16, addr uintptr, lenBytes uint32, offset uint64) {
	c.reset(OpReadFixed, f)
	c.buf, c.bufIndex, c.addr, c.length, c.offset = buf, bufIndex, addr, lenBytes, offset
}

// PrepWriteFixed prepares a write from registered buffer bufIndex (buf).
func (c *Completion) PrepWriteFixed(f *File, buf *Buffer, bufIndex uint16, addr uintptr, lenBytes uint32, offset uint64) {
	c.reset(OpWriteFixed, f)
	c.buf, c.bufIndex, c.addr, c.length, c.offset = buf, bufIndex, addr, lenBytes, offset
}

// PrepReadv prepares a vectored read; iov must stay allocated and unchanged
// until the callback.
func (c *Completion) PrepReadv(f *File, iov *Iovecs, offset uint64) {
	c.reset(OpReadv, f)
	c.iov, c.offset = iov, offset
	c.length = uint32(min(iov.TotalBytes(), 1<<32-1))
}

// PrepWritev prepares a vectored write.
func (c *Completion) PrepWritev(f *File, iov *Iovecs, offset uint64) {
	c.reset(OpWritev, f)
	c.iov, c.offset = iov, offset
	c.length = uint32(min(iov.TotalBytes(), 1<<32-1))
}

// PrepFsync prepares fsync(2) of the file.
func (c *Completion) PrepFsync(f *File) { c.reset(OpFsync, f) }

// PrepFdatasync prepares fdatasync(2) of the file.
func (c *Completion) PrepFdatasync(f *File) { c.reset(OpFdatasync, f) }

// AlignmentError says which part of an O_DIRECT request is misaligned.
type AlignmentError struct {
	Op    Op
	Path  string
	What  string // "buffer", "offset" or "length"
	Value uint64 // the misaligned address, offset or length
	Align uint32
}

func (e *AlignmentError) Error() string {
	return fmt.Sprintf("uring: %s %s: %s %#x not aligned to %d for O_DIRECT", e.Op, e.Path, e.What, e.Value, e.Align)
}

func (e *AlignmentError) Unwrap() error { return ErrMisaligned }

// validate checks a prepared completion before it is queued: the same rules
// for every engine, so a simulator (uring/uringsim) rejects what the ring would.
func (c *Completion) validate() error {
	if c.op == OpNop {
		return nil
	}
	if c.file == nil || c.file.FD < 0 {
		return fmt.Errorf("uring: %s: %w: no open file", c.op, ErrInvalid)
	}
	switch c.op {
	case OpReadFixed, OpWriteFixed:
		if c.buf == nil || c.buf.mem == nil {
			return fmt.Errorf("uring: %s %s: %w: no registered buffer", c.op, c.file.Path, ErrInvalid)
		}
		if c.addr < c.buf.Addr() || uint64(c.addr-c.buf.Addr())+uint64(c.length) > uint64(c.buf.Len()) {
			return fmt.Errorf("uring: %s %s: %w: range [%#x,+%d) outside registered buffer %d", c.op, c.file.Path, ErrInvalid, c.addr, c.length, c.bufIndex)
		}
	case OpReadv, OpWritev:
		if c.iov == nil || c.iov.n == 0 {
			return fmt.Errorf("uring: %s %s: %w: empty iovecs", c.op, c.file.Path, ErrInvalid)
		}
	}
	a := uint64(c.file.DirectAlign)
	if a == 0 || c.op == OpFsync || c.op == OpFdatasync {
		return nil
	}
	misaligned := func(what string, v uint64) error {
		return &AlignmentError{Op: c.op, Path: c.file.Path, What: what, Value: v, Align: c.file.DirectAlign}
	}
	if c.offset%a != 0 {
		return misaligned("offset", c.offset)
	}
	if c.op == OpReadv || c.op == OpWritev {
		for i := 0; i < c.iov.n; i++ {
			if c.iov.vec[i].Base%a != 0 {
				return misaligned("buffer", c.iov.vec[i].Base)
			}
			if c.iov.vec[i].Len%a != 0 {
				return misaligned("length", c.iov.vec[i].Len)
			}
		}
		return nil
	}
	if uint64(c.addr)%a != 0 {
		return misaligned("buffer", uint64(c.addr))
	}
	if uint64(c.length)%a != 0 {
		return misaligned("length", uint64(c.length))
	}
	return nil
}

// opError wraps an errno with the op, file and offset.
func (c *Completion) opError(err error) error {
	if c.file == nil {
		return fmt.Errorf("uring: %s: %w", c.op, err)
	}
	return fmt.Errorf("uring: %s %s offset %d length %d: %w", c.op, c.file.Path, c.offset, c.length, err)
}

// advance records n more bytes done and reports whether the op is finished
// (all bytes, or EOF on a read with n == 0). Vectored ops rewrite the current
// iovec so that the next submission starts after the bytes done.
func (c *Completion) advance(n uint32) (done bool) {
	if c.op == OpNop || c.op == OpFsync || c.op == OpFdatasync {
		return true
	}
	c.progress += n
	if c.progress >= c.length || (n == 0 && c.op.IsRead()) {
		c.restoreIov()
		return true
	}
	if n == 0 {
		// A write that transfers nothing would loop forever; the caller
		// turns this into an error.
		return true
	}
	if c.iov != nil {
		c.skipIov(n)
	}
	return false
}

func (c *Completion) skipIov(n uint32) {
	left := uint64(n)
	for left > 0 && c.iovStart < c.iov.n {
		e := &c.iov.vec[c.iovStart]
		if left < e.Len {
			if !c.iovSavedOK {
				c.iovSavedLen, c.iovSavedOK = e.Len, true
			}
			e.Base += left
			e.Len -= left
			return
		}
		left -= e.Len
		c.restoreEntry()
		c.iovStart++
	}
}

// restoreEntry puts back the original of entry iovStart if it was rewritten.
func (c *Completion) restoreEntry() {
	if !c.iovSavedOK {
		return
	}
	e := &c.iov.vec[c.iovStart]
	consumed := c.iovSavedLen - e.Len
	e.Base -= consumed
	e.Len = c.iovSavedLen
	c.iovSavedOK = false
}

func (c *Completion) restoreIov() {
	if c.iov != nil && c.iovStart < c.iov.n {
		c.restoreEntry()
	}
}

// cur returns the address and length of the remaining transfer (non-vectored).
func (c *Completion) cur() (addr uintptr, n uint32, off uint64) {
	return c.addr + uintptr(c.progress), c.length - c.progress, c.offset + uint64(c.progress)
}

// applyResult applies one kernel result (bytes, or -errno) to c, the same
// way for every engine. It reports whether c is finished (Result and Err
// set); false means c must be submitted again for the rest (short transfer)
// or after EINTR/EAGAIN, bounded by maxIORetries.
func applyResult(c *Completion, res int32, st *Stats) bool {
	if res < 0 {
		errno := unix.Errno(-res)
		if (errno == unix.EINTR || errno == unix.EAGAIN) && c.retries < maxIORetries {
			c.retries++
			st.Retries++
			return false
		}
		c.restoreIov()
		c.Result, c.Err = int64(c.progress), c.opError(errno)
		return true
	}
	if c.op == OpNop {
		c.Result = int64(res)
		return true
	}
	if c.advance(uint32(res)) {
		c.Result = int64(c.progress)
		if c.op.IsWrite() && c.progress < c.length {
			c.Err = c.opError(io.ErrShortWrite)
		}
		return true
	}
	st.Continuations++
	return false
}

// queue is an intrusive FIFO of completions.
type queue struct {
	head, tail *Completion
	n          int
}

func (q *queue) push(c *Completion) {
	c.next = nil
	if q.tail == nil {
		q.head = c
	} else {
		q.tail.next = c
	}
	q.tail = c
	q.n++
}

func (q *queue) pushFront(c *Completion) {
	c.next = q.head
	q.head = c
	if q.tail == nil {
		q.tail = c
	}
	q.n++
}

func (q *queue) pop() *Completion {
	c := q.head
	if c == nil {
		return nil
	}
	q.head = c.next
	if q.head == nil {
		q.tail = nil
	}
	c.next = nil
	q.n--
	return c
}

// take detaches the whole list.
func (q *queue) take() *Completion {
	h := q.head
	q.head, q.tail, q.n = nil, nil, 0
	return h
}

// runCallbacks runs the callbacks of a detached list in order.
func runCallbacks(h *Completion) {
	for h != nil {
		c := h
		h = h.next
		c.next = nil
		if c.Callback != nil {
			c.Callback(c)
		}
	}
}
