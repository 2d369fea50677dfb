package uring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ring's memory: the kernel's mmaps or the application's own region
// (NoMmap), and the layout a second producer (the GPU) drives it by.

// Region is memory of the ring that a second producer (the GPU) must map.
type Region struct {
	Name string // "sq_ring", "cq_ring", "sqes", or "rings+sqes" (NoMmap)
	Addr uintptr
	Len  int
}

// RingLayout is everything a second producer needs to drive the ring: the
// addresses of the shared indices and arrays (all inside Regions), the sizes,
// and the ring fd (for io_uring_enter with SQ_WAKEUP). Producer protocol:
// write SQE at SQEs + (tail & SQMask)*SQESize, then store-release *SQTail;
// the SQ array is pre-filled with the identity mapping. With SQPOLL, after
// the tail store a full fence, then if *SQFlags & NeedWakeupFlag, enter with
// SQ_WAKEUP. Consumers read *CQTail with acquire, the CQEs, then store-release
// *CQHead.
type RingLayout struct {
	FD                   int
	SetupFlags, Features uint32
	SQEntries, CQEntries uint32
	SQHead, SQTail       uintptr
	SQMask, SQFlags      uintptr
	SQArray              uintptr
	SQEs                 uintptr
	SQESize              uint32
	CQHead, CQTail       uintptr
	CQMask               uintptr
	CQEs                 uintptr
	CQESize              uint32
	NeedWakeupFlag       uint32 // IORING_SQ_NEED_WAKEUP
	EnterSQWakeup        uint32 // IORING_ENTER_SQ_WAKEUP
	EnterGetEvents       uint32 // IORING_ENTER_GETEVENTS
	Regions              []Region
}

// ringsBytes bounds the kernel's rings_size(): the struct io_rings header
// (under 1 KiB on every 6.x kernel), the CQEs, cache-line alignment, and
// the SQ index array.
func ringsBytes(sqN, cqN uint32) int {
	return 1024 + int(cqN)*int(unsafe.Sizeof(cqe{})) + 64 + int(sqN)*4
}

func (r *Ring) sqeOffset(sqN, cqN uint32) int {
	return roundUp(ringsBytes(sqN, cqN), unix.Getpagesize())
}

// allocAppMem maps one region for rings and SQEs (NoMmap). A huge page is
// tried first because kernels before the region rework accept a multi-page
// ring only if it lies in one folio; later kernels vmap any pinned pages.
func (r *Ring) allocAppMem(sqN, cqN uint32) error {
	total := r.sqeOffset(sqN, cqN) + roundUp(int(sqN)*int(unsafe.Sizeof(sqe{})), unix.Getpagesize())
	const huge = 2 << 20
	if total <= huge {
		mem, err := unix.Mmap(-1, 0, huge, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
		if err == nil {
			r.appMem, r.appHuge = mem, true
			return nil
		}
	}
	mem, err := unix.Mmap(-1, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: new ring: mapping %d bytes of ring memory: %w", total, err)
	}
	r.appMem = mem
	return nil
}

func (r *Ring) freeMem() {
	// The four mappings are distinct (cqRingMem is nil with SINGLE_MMAP).
	for _, m := range [][]byte{r.sqeMem, r.cqRingMem, r.sqRingMem, r.appMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqRingMem, r.sqRingMem, r.appMem = nil, nil, nil, nil
}

func (r *Ring) mapRings() error {
	p := &r.p
	sqRingLen := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqRingLen := int(p.CQOff.Cqes) + int(p.CQEntries)*int(unsafe.Sizeof(cqe{}))
	sqeLen := int(p.SQEntries) * int(unsafe.Sizeof(sqe{}))
	var sqRing, cqRing, sqes []byte
	if r.cfg.NoMmap {
		sqeOff := r.sqeOffset(p.SQEntries, p.CQEntries)
		if max(sqRingLen, cqRingLen) > sqeOff {
			return fmt.Errorf("uring: new ring: kernel ring layout (%d bytes) exceeds the %d bytes reserved for it", max(sqRingLen, cqRingLen), sqeOff)
		}
		sqRing, cqRing, sqes = r.appMem, r.appMem, r.appMem[sqeOff:sqeOff+sqeLen]
		r.regions = []Region{{Name: "rings+sqes", Addr: uintptr(unsafe.Pointer(&r.appMem[0])), Len: len(r.appMem)}}
	} else {
		var err error
		if r.features&featSingleMmap != 0 {
			sqRingLen = max(sqRingLen, cqRingLen)
		}
		sqRing, err = unix.Mmap(r.fd, offSQRing, sqRingLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: new ring: mmap SQ ring: %w", err)
		}
		r.sqRingMem = sqRing
		cqRing = sqRing
		if r.features&featSingleMmap == 0 {
			cqRing, err = unix.Mmap(r.fd, offCQRing, cqRingLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
			if err != nil {
				return fmt.Errorf("uring: new ring: mmap CQ ring: %w", err)
			}
			r.cqRingMem = cqRing
		}
		sqes, err = unix.Mmap(r.fd, offSQEs, sqeLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: new ring: mmap SQEs: %w", err)
		}
		r.sqeMem = sqes
		r.regions = []Region{{Name: "sq_ring", Addr: uintptr(unsafe.Pointer(&sqRing[0])), Len: len(sqRing)}}
		if r.cqRingMem != nil {
			r.regions = append(r.regions, Region{Name: "cq_ring", Addr: uintptr(unsafe.Pointer(&cqRing[0])), Len: len(cqRing)})
		}
		r.regions = append(r.regions, Region{Name: "sqes", Addr: uintptr(unsafe.Pointer(&sqes[0])), Len: len(sqes)})
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail, r.sqFlags = u32(sqRing, p.SQOff.Head), u32(sqRing, p.SQOff.Tail), u32(sqRing, p.SQOff.Flags)
	r.sqMask, r.sqEntries = *u32(sqRing, p.SQOff.RingMask), *u32(sqRing, p.SQOff.RingEntries)
	r.sqArray = unsafe.Slice(u32(sqRing, p.SQOff.Array), p.SQEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&sqes[0])), p.SQEntries)
	r.cqHead, r.cqTail = u32(cqRing, p.CQOff.Head), u32(cqRing, p.CQOff.Tail)
	r.cqMask = *u32(cqRing, p.CQOff.RingMask)
	r.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&cqRing[p.CQOff.Cqes])), p.CQEntries)
	// Identity SQ array: slot i of the SQE array is always index i, so a
	// producer only writes SQEs and the tail.
	for i := range r.sqArray {
		r.sqArray[i] = uint32(i)
	}
	r.sqLocalTail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Layout returns the addresses a second producer needs; valid until Close.
func (r *Ring) Layout() RingLayout {
	addr := func(p *uint32) uintptr { return uintptr(unsafe.Pointer(p)) }
	cqRing := r.sqRingMem
	if r.cqRingMem != nil {
		cqRing = r.cqRingMem
	}
	if r.appMem != nil {
		cqRing = r.appMem
	}
	sqRing := r.sqRingMem
	if r.appMem != nil {
		sqRing = r.appMem
	}
	return RingLayout{
		FD: r.fd, SetupFlags: r.p.Flags, Features: r.features,
		SQEntries: r.p.SQEntries, CQEntries: r.p.CQEntries,
		SQHead: addr(r.sqHead), SQTail: addr(r.sqTail),
		SQMask: uintptr(unsafe.Pointer(&sqRing[r.p.SQOff.RingMask])), SQFlags: addr(r.sqFlags),
		SQArray: uintptr(unsafe.Pointer(&r.sqArray[0])),
		SQEs:    uintptr(unsafe.Pointer(&r.sqes[0])), SQESize: uint32(unsafe.Sizeof(sqe{})),
		CQHead: addr(r.cqHead), CQTail: addr(r.cqTail),
		CQMask: uintptr(unsafe.Pointer(&cqRing[r.p.CQOff.RingMask])),
		CQEs:   uintptr(unsafe.Pointer(&r.cqes[0])), CQESize: uint32(unsafe.Sizeof(cqe{})),
		NeedWakeupFlag: sqNeedWakeup, EnterSQWakeup: enterSQWakeup, EnterGetEvents: enterGetEvents,
		Regions: append([]Region(nil), r.regions...),
	}
}

// HugePageRing reports whether a NoMmap ring got a MAP_HUGETLB region.
func (r *Ring) HugePageRing() bool { return r.appHuge }
