package uring

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// File is an open file plus what an engine must know to check O_DIRECT
// alignment before submission. The caller owns it and calls Close once,
// after every I/O on it completed (and after the ring that registered it
// was closed or its files unregistered).
type File struct {
	FD          int32
	Index       int32  // index in the ring's registered files, or -1
	DirectAlign uint32 // required alignment of buffer address, offset and length; 0 = buffered I/O
	Path        string
}

// defaultDirectAlign is used when statx does not report DIOALIGN (older
// kernels, some file systems): 4096 is safe on every common device.
const defaultDirectAlign = 4096

// OpenFile opens path with open(2) flags (O_CLOEXEC is added). With O_DIRECT,
// DirectAlign is the larger of statx's dio_mem_align and dio_offset_align
// (fallback 4096 when statx does not report them).
func OpenFile(path string, flags int, perm uint32) (*File, error) {
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, fmt.Errorf("uring: opening %s: %w", path, err)
	}
	f := &File{FD: int32(fd), Index: -1, Path: path}
	if flags&unix.O_DIRECT != 0 {
		f.DirectAlign = directAlign(fd)
	}
	return f, nil
}

// NewFile wraps a descriptor the caller opened; directAlign as in File.
func NewFile(fd int, directAlign uint32, path string) *File {
	return &File{FD: int32(fd), Index: -1, DirectAlign: directAlign, Path: path}
}

func directAlign(fd int) uint32 {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil || st.Mask&unix.STATX_DIOALIGN == 0 {
		return defaultDirectAlign
	}
	a := max(st.Dio_mem_align, st.Dio_offset_align)
	if a == 0 {
		// The file system reports that O_DIRECT is unsupported; the kernel
		// would have refused the open, so this is a block device or similar.
		return defaultDirectAlign
	}
	return a
}

// Close closes the descriptor. A second Close returns ErrClosed.
func (f *File) Close() error {
	if f.FD < 0 {
		return fmt.Errorf("uring: closing %s: %w", f.Path, ErrClosed)
	}
	err := unix.Close(int(f.FD))
	f.FD = -1
	if err != nil {
		return fmt.Errorf("uring: closing %s: %w", f.Path, err)
	}
	return nil
}
