package faultfs

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Extent is a byte range of a file and where it lies on the device.
type Extent struct {
	Logical, Physical, Length int64
}

// FIEMAP (linux/fiemap.h).
const (
	fsIocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync    = 0x1
	fiemapExtentLast  = 0x1
	fiemapExtentNoLoc = 0x2 | 0x4 | 0x8 | 0x80 // unknown, delalloc, encoded, not aligned / inline data
	fiemapBatch       = 64
	maxExtentCalls    = 1024 // bounds a file's extents at maxExtentCalls*fiemapBatch
)

type fiemapExtent struct {
	Logical, Physical, Length uint64
	_                         [2]uint64
	Flags                     uint32
	_                         [3]uint32
}

type fiemap struct {
	Start, Length                     uint64
	Flags, MappedExtents, ExtentCount uint32
	_                                 uint32
	Extents                           [fiemapBatch]fiemapExtent
}

// Extents maps the bytes [off, off+n) of the open file fd to the device
// (FIEMAP, after syncing the file so that delayed allocations have a place).
// A byte without a place on the device (a hole, inline data) is an error.
func Extents(fd int, off, n int64) ([]Extent, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("faultfs: extents of [%d,+%d): empty or negative range", off, n)
	}
	var out []Extent
	next := off
	for calls := 0; next < off+n; calls++ {
		if calls == maxExtentCalls {
			return nil, fmt.Errorf("faultfs: extents of [%d,+%d): more than %d extents", off, n, maxExtentCalls*fiemapBatch)
		}
		fm := fiemap{Start: uint64(next), Length: uint64(off + n - next), Flags: fiemapFlagSync, ExtentCount: fiemapBatch}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&fm))); e != 0 {
			return nil, fmt.Errorf("faultfs: FIEMAP at %d: %w", next, e)
		}
		if fm.MappedExtents == 0 {
			return nil, fmt.Errorf("faultfs: bytes from %d have no extent (a hole)", next)
		}
		for _, e := range fm.Extents[:fm.MappedExtents] {
			lo, hi := int64(e.Logical), int64(e.Logical+e.Length)
			if lo > next {
				return nil, fmt.Errorf("faultfs: bytes [%d,%d) have no extent (a hole)", next, lo)
			}
			if e.Flags&fiemapExtentNoLoc != 0 {
				return nil, fmt.Errorf("faultfs: extent at %d has no place on the device (flags %#x)", lo, e.Flags)
			}
			from, to := max(lo, next), min(hi, off+n)
			if from < to {
				out = append(out, Extent{Logical: from, Physical: int64(e.Physical) + from - lo, Length: to - from})
				next = to
			}
			if e.Flags&fiemapExtentLast != 0 && next < off+n {
				return nil, fmt.Errorf("faultfs: bytes from %d lie past the file's last extent", next)
			}
		}
	}
	return out, nil
}
