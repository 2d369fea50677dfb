package runtime

// PathCPU's save writes go straight from the engine's pages: one O_DIRECT
// vectored write per save write, its entries the page planes (or their cut
// ends) in object order, checksummed on the stage worker. Nothing is
// copied, so a save costs the CPU its CRCs only, and the engine's pages are
// read until the write completes (Gathered closes then). A write whose pages
// do not meet the pool file's O_DIRECT alignment, or that would need more
// entries than its iovecs hold, is copied into its staging as before and
// counted (Stats.SaveStagedWrites, SaveStagedReason): the bytes on disk are
// the same.

import (
	"fmt"
	"unsafe"

	"github.com/tutti-io/tutti/uring"
)

// maxSaveIovecs bounds one direct write's entries (the kernel's UIO_MAXIOV).
const maxSaveIovecs = 1024

// saveIovecCap is the iovec capacity of one write buffer of wbufBytes: every
// page plane it can hold, both cut ends and the padding, at most
// maxSaveIovecs.
func saveIovecCap(wbufBytes, planeBytes int64) int {
	return int(min(maxSaveIovecs, wbufBytes/planeBytes+3))
}

// stageWhy says why a PathCPU save write was staged through a copy; the
// zero value means it can be written from the pages. It is a value (not a
// formatted error) so that a store whose every write is staged allocates
// nothing per write.
type stageWhy struct {
	kind        uint8 // 0: direct; whyNoIovecs, whyUnaligned, whyIovecCap
	layer, page int
	plane       int
	addr        uintptr
	n           int64
	align       uint32
	cap         int
	err         error // whyNoIovecs: the allocation's
}

const (
	whyNoIovecs = iota + 1
	whyUnaligned
	whyIovecCap
)

func (w stageWhy) String() string {
	switch w.kind {
	case whyNoIovecs:
		return fmt.Sprintf("no iovecs for direct writes: %v", w.err)
	case whyUnaligned:
		return fmt.Sprintf("layer %d page %d plane %d: %d bytes at %#x, but the pool file's O_DIRECT needs address and length in multiples of %d",
			w.layer, w.page, w.plane, w.n, w.addr, w.align)
	case whyIovecCap:
		return fmt.Sprintf("a write of layer %d needs more than %d iovecs (page planes too small for one write's size)", w.layer, w.cap)
	}
	return ""
}

// directIovecs lists b's write (b.io, b.ioBytes set) in b.iov: the bytes of
// the engine's pages in object order, contiguous pieces merged, then zero
// padding from b.data up to b.ioBytes. It returns the zero stageWhy when
// every entry meets align (0: buffered I/O, anything goes), else why the
// write must be staged. pages[p] is the p-th page from the run's first chunk.
func (b *wbuf) directIovecs(v *kvViews, pages []int32, align uint32) stageWhy {
	if b.iov == nil {
		return stageWhy{kind: whyNoIovecs, err: b.iovErr}
	}
	iov := b.iov
	iov.Reset()
	a := uintptr(align)
	if a == 0 {
		a = 1
	}
	var pend uintptr // the entry being extended: [pend, pend+pendN)
	var pendN int64
	var pendAt [2]int // its first (page, plane), for the reason
	flush := func() stageWhy {
		if pendN == 0 {
			return stageWhy{}
		}
		if pend%a != 0 || uintptr(pendN)%a != 0 {
			return stageWhy{kind: whyUnaligned, layer: b.io.Layer, page: pendAt[0], plane: pendAt[1], addr: pend, n: pendN, align: align}
		}
		if iov.Append(pend, int(pendN)) != nil {
			return stageWhy{kind: whyIovecCap, layer: b.io.Layer, cap: iov.Len()}
		}
		return stageWhy{}
	}
	add := func(addr uintptr, n int64, page, plane int) stageWhy {
		if pendN > 0 && pend+uintptr(pendN) == addr {
			pendN += n
			return stageWhy{}
		}
		if w := flush(); w.kind != 0 {
			return w
		}
		pend, pendN, pendAt = addr, n, [2]int{page, plane}
		return stageWhy{}
	}
	start, end := b.io.OffsetBytes, b.io.OffsetBytes+b.io.Bytes
	pb := v.planeBytes
	for u := start / pb; u*pb < end; u++ {
		us := u * pb
		lo, hi := max(us, start), min(us+pb, end)
		page, plane := pages[u/v.planes], int(u%v.planes)
		kv := v.plane(b.io.Layer, plane, page)[lo-us : hi-us]
		if w := add(uintptr(unsafe.Pointer(&kv[0])), hi-lo, int(page), plane); w.kind != 0 {
			return w
		}
	}
	if w := flush(); w.kind != 0 {
		return w
	}
	if pad := b.ioBytes - b.io.Bytes; pad > 0 {
		clear(b.data[:pad]) // deterministic bytes on disk
		pend, pendN = b.sl.buf.Addr()+uintptr(b.off), pad
		pendAt = [2]int{-1, -1}
		if w := flush(); w.kind != 0 {
			return w
		}
	}
	return stageWhy{}
}

// newSaveIovecs gives a PathCPU write buffer its iovecs; on failure the
// buffer's writes are staged, and the error says why (stageWhy).
func (b *wbuf) newSaveIovecs(capacity int) {
	b.iov, b.iovErr = uring.NewIovecs(capacity)
}

// freeIovecs releases b's iovecs (at Close, after every write completed).
func (b *wbuf) freeIovecs() error {
	if b.iov == nil {
		return nil
	}
	err := b.iov.Free()
	b.iov = nil
	return err
}
