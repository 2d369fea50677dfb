package cpu

// O_DIRECT vectored I/O straight between a pool file and the engine's pages:
// a save write's entries are the page planes it writes (saves: gather.go),
// a load read's those it fills (loads: loaddirect.go). The
// one rule for both lives here: entries in object order, contiguous pieces
// merged, each entry's address and length a multiple of the pool file's
// O_DIRECT alignment, at most the iovecs' capacity; an I/O that breaks it
// goes through staging with a copy, counted with its stageWhy.

import (
	"fmt"
	"unsafe"

	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/uring"
)

// maxDirectIovecs bounds one direct I/O's entries (the kernel's UIO_MAXIOV).
const maxDirectIovecs = 1024

// directIovecCap is the iovec capacity for direct I/Os of up to ioBytes:
// every page plane they can hold, both cut ends and a staging entry at
// either end, at most maxDirectIovecs.
func directIovecCap(ioBytes, planeBytes int64) int {
	return int(min(maxDirectIovecs, ioBytes/planeBytes+4))
}

// stageWhy says why an I/O went through staging with a copy; the zero
// value means it can use the pages. It is a value (not a formatted error)
// so that a store whose every I/O is staged allocates nothing per I/O.
type stageWhy struct {
	kind        mover.StageCause // StageNone: direct
	layer, page int
	plane       int
	addr        uintptr
	n           int64
	align       uint32
	cap         int
	err         error // StageNoIovecs: the allocation's
}

func (w stageWhy) String() string {
	switch w.kind {
	case mover.StageNoIovecs:
		return fmt.Sprintf("no iovecs for direct I/O: %v", w.err)
	case mover.StageUnaligned:
		if w.page < 0 {
			return fmt.Sprintf("layer %d: %d staging bytes at %#x beside the pages, but the pool file's O_DIRECT needs address and length in multiples of %d",
				w.layer, w.n, w.addr, w.align)
		}
		return fmt.Sprintf("layer %d page %d plane %d: %d bytes at %#x, but the pool file's O_DIRECT needs address and length in multiples of %d",
			w.layer, w.page, w.plane, w.n, w.addr, w.align)
	case mover.StageIovecCap:
		return fmt.Sprintf("an I/O of layer %d needs more than %d iovecs (page planes too small for one I/O's size)", w.layer, w.cap)
	}
	return ""
}

// directIO lists one direct I/O's entries into iov.
type directIO struct {
	iov    *uring.Iovecs
	align  uintptr
	align0 uint32 // as the file gives it, for the reason
	layer  int
	pend   uintptr // the entry being extended: [pend, pend+pendN)
	pendN  int64
	pendAt [2]int // its first (page, plane), for the reason; page -1: staging
}

// newDirectIO starts an I/O of layer over iov (reset), for a file whose
// O_DIRECT alignment is align (0: buffered I/O, anything goes).
func newDirectIO(iov *uring.Iovecs, align uint32, layer int) directIO {
	iov.Reset()
	a := uintptr(align)
	if a == 0 {
		a = 1
	}
	return directIO{iov: iov, align: a, align0: align, layer: layer}
}

// add appends n bytes at addr; page and plane name them in a reason (page
// -1: staging memory).
func (d *directIO) add(addr uintptr, n int64, page, plane int) stageWhy {
	if d.pendN > 0 && d.pend+uintptr(d.pendN) == addr {
		d.pendN += n
		return stageWhy{}
	}
	if w := d.flush(); w.kind != mover.StageNone {
		return w
	}
	d.pend, d.pendN, d.pendAt = addr, n, [2]int{page, plane}
	return stageWhy{}
}

// flush ends the entry being extended; the I/O is complete after it.
func (d *directIO) flush() stageWhy {
	if d.pendN == 0 {
		return stageWhy{}
	}
	n := d.pendN
	d.pendN = 0
	if d.pend%d.align != 0 || uintptr(n)%d.align != 0 {
		return stageWhy{kind: mover.StageUnaligned, layer: d.layer, page: d.pendAt[0], plane: d.pendAt[1], addr: d.pend, n: n, align: d.align0}
	}
	if d.iov.Append(d.pend, int(n)) != nil {
		return stageWhy{kind: mover.StageIovecCap, layer: d.layer, cap: d.iov.Len()}
	}
	return stageWhy{}
}

// planes appends the bytes [start, end) of d's layer of consecutive chunks,
// laid out as objmap stores them (as Views.CopyPages walks them): pages[p]
// is the p-th page from the first chunk.
func (d *directIO) planes(v *Views, pages []int32, start, end int64) stageWhy {
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		page, plane := pages[u/v.planes], int(u%v.planes)
		kv := v.Plane(d.layer, plane, page)[lo-us : hi-us]
		if w := d.add(uintptr(unsafe.Pointer(&kv[0])), hi-lo, int(page), plane); w.kind != mover.StageNone {
			return w
		}
	}
	return stageWhy{}
}
