package kernels

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors; callers branch with errors.Is.
var (
	ErrNotLoaded    = errors.New("kernels: library not loaded")
	ErrABI          = errors.New("kernels: library ABI version mismatch")
	ErrNoGPU        = errors.New("kernels: no GPU")
	ErrCUDA         = errors.New("kernels: CUDA call failed")
	ErrInvalid      = errors.New("kernels: descriptor rejected")
	ErrBusy         = errors.New("kernels: all request slots in use")
	ErrRingBroken   = errors.New("kernels: ring broken by an earlier timeout")
	ErrNotSupported = errors.New("kernels: not supported")
	ErrIO           = errors.New("kernels: I/O entry failed")
)

// EntryStatus is the outcome of one I/O entry of a GPU-driven restore.
type EntryStatus uint32

// Entry statuses (tutti_kernels.h TK_ENTRY_*).
const (
	EntryPending EntryStatus = iota
	EntryOK
	EntryIOError // Res is -errno
	EntryShort   // Res is the bytes that arrived (read past the end of a file)
	EntryTimeout // no completion within Config.PollTimeout; the ring is broken after it
	EntrySkipped // not submitted: the ring was already broken
)

func (s EntryStatus) String() string {
	switch s {
	case EntryPending:
		return "pending"
	case EntryOK:
		return "ok"
	case EntryIOError:
		return "io-error"
	case EntryShort:
		return "short"
	case EntryTimeout:
		return "timeout"
	case EntrySkipped:
		return "skipped"
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// EntryResult is what the GPU recorded for one entry.
type EntryResult struct {
	Status EntryStatus
	Res    int32 // CQE result: bytes, or -errno
}

// EntryError describes one failed entry; it wraps ErrIO and, for I/O errors,
// the errno (errors.Is(err, syscall.EBADF)).
type EntryError struct {
	Layer, Entry int
	// Extent is the index, in the request's extents of that layer, of the
	// extent the entry reads (Plan.EntryExtent): what a caller maps back to
	// its own runs.
	Extent int
	Offset int64
	Result EntryResult
}

func (e *EntryError) Error() string {
	if e.Result.Status == EntryIOError {
		return fmt.Sprintf("layer %d entry %d (offset %d): %v: %v", e.Layer, e.Entry, e.Offset, e.Result.Status, syscall.Errno(-e.Result.Res))
	}
	return fmt.Sprintf("layer %d entry %d (offset %d): %v (res %d)", e.Layer, e.Entry, e.Offset, e.Result.Status, e.Result.Res)
}

// Unwrap gives ErrIO and, for an I/O error, the errno.
func (e *EntryError) Unwrap() []error {
	if e.Result.Status == EntryIOError && e.Result.Res < 0 {
		return []error{ErrIO, syscall.Errno(-e.Result.Res)}
	}
	return []error{ErrIO}
}
