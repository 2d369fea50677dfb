package uring

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Config of a Ring. Zero fields take the defaults noted.
type Config struct {
	Entries     uint32 // SQ entries, rounded up to a power of two by the kernel; 0 = 128, at most 32768
	CQEntries   uint32 // CQ entries; 0 = 2*Entries
	MaxInFlight int    // bound on I/O in the kernel; 0 = CQ entries; never more than CQ entries (so the CQ cannot overflow)

	SQPoll         bool   // IORING_SETUP_SQPOLL: a kernel thread (iou-sqp-PID) polls the SQ
	SQThreadIdleMs uint32 // SQPOLL: idle time before the thread sleeps and sets IORING_SQ_NEED_WAKEUP; 0 = kernel default (1 s)
	SQThreadCPU    int    // SQPOLL: CPU to pin the thread to (IORING_SETUP_SQ_AFF), -1 = none. Note the zero value pins to CPU 0: start from DefaultConfig.

	// SingleIssuer (IORING_SETUP_SINGLE_ISSUER) and DeferTaskrun
	// (IORING_SETUP_DEFER_TASKRUN, implies SingleIssuer, not with SQPoll)
	// bind the ring to the OS thread that creates it: the owning goroutine
	// must call runtime.LockOSThread before New and keep it locked, or
	// io_uring_enter fails with EEXIST.
	SingleIssuer bool
	DeferTaskrun bool
	// Disabled (IORING_SETUP_R_DISABLED) creates the ring disabled: nothing
	// can be submitted until Enable, and with SingleIssuer or DeferTaskrun
	// the thread that calls Enable, not the creator, becomes the ring's one
	// issuer. This is how a ring made by one goroutine is handed to a
	// locked OS thread (the GPU ring's kick loop).
	Disabled    bool
	CoopTaskrun bool // IORING_SETUP_COOP_TASKRUN (+TASKRUN_FLAG): no IPI to post completions; Flush enters the kernel to run them

	// NoMmap (IORING_SETUP_NO_MMAP, Linux 6.5+): the rings and SQEs live in
	// memory this package maps itself (one anonymous mmap, rings first, SQEs
	// at the next page), which Layout exposes for registration with a GPU.
	// Kernels before 6.13 or so need each multi-page region in one folio
	// (a huge page); a MAP_HUGETLB mapping is tried first for that reason.
	NoMmap bool
}

// DefaultConfig is 128 entries, no SQPOLL, no CPU affinity.
func DefaultConfig() Config { return Config{Entries: 128, SQThreadCPU: -1} }

// Ring is an io_uring instance driven from Go. It implements Engine; like
// every Engine it is owned by one goroutine.
type Ring struct {
	fd       int
	p        params
	cfg      Config
	closed   bool
	features uint32

	// memory: mmap'd regions, or one app-provided region (NoMmap)
	sqRingMem, cqRingMem, sqeMem, appMem []byte
	appHuge                              bool
	regions                              []Region

	sqHead, sqTail, sqFlags *uint32
	sqMask, sqEntries       uint32
	sqArray                 []uint32
	sqes                    []sqe
	sqLocalTail             uint32
	toSubmit                uint32

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []cqe

	slots    []*Completion // user_data = slot index; keeps completions reachable while the kernel has them
	freeSlot []uint32
	inKernel int

	overflow queue // prepared, not yet in the SQ (SQ full, MaxInFlight, continuations, retries)
	done     queue // reaped, callbacks pending

	files        []*File // registered files; File.Index is valid only for these on this ring
	bufs         []*Buffer
	sqTID        int   // iou-sqp thread, -1 until resolved
	sqCandidates []int // threads that appeared during setup
	stats        Stats
}

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

func roundPow2(v uint32) uint32 {
	if v <= 1 {
		return 1
	}
	return 1 << bits.Len32(v-1)
}

func roundUp(v, to int) int { return (v + to - 1) / to * to }

// New sets up a ring. A setup flag the kernel refuses is reported as an
// error wrapping ErrNotSupported that names the flag.
func New(cfg Config) (*Ring, error) {
	if cfg.Entries == 0 {
		cfg.Entries = 128
	}
	if cfg.Entries > 32768 {
		return nil, fmt.Errorf("uring: new ring: %w: %d entries (max 32768)", ErrInvalid, cfg.Entries)
	}
	sqN := roundPow2(cfg.Entries)
	cqN := roundPow2(cfg.CQEntries)
	if cfg.CQEntries == 0 {
		cqN = 2 * sqN
	}
	if cqN < sqN {
		return nil, fmt.Errorf("uring: new ring: %w: CQ entries %d < SQ entries %d", ErrInvalid, cqN, sqN)
	}
	if cfg.SQPoll && cfg.DeferTaskrun {
		return nil, fmt.Errorf("uring: new ring: %w: DeferTaskrun cannot be combined with SQPoll", ErrInvalid)
	}
	p := params{}
	p.Flags = flagsOf(cfg)
	p.CQEntries = cqN
	if cfg.SQPoll {
		p.SQThreadIdle = cfg.SQThreadIdleMs
		if cfg.SQThreadCPU >= 0 {
			p.SQThreadCPU = uint32(cfg.SQThreadCPU)
		}
	}
	r := &Ring{cfg: cfg, fd: -1, sqTID: -1}
	if cfg.NoMmap {
		if err := r.allocAppMem(sqN, cqN); err != nil {
			return nil, err
		}
		p.CQOff.UserAddr = uint64(uintptr(unsafe.Pointer(&r.appMem[0])))
		p.SQOff.UserAddr = p.CQOff.UserAddr + uint64(r.sqeOffset(sqN, cqN))
	}
	var before map[int]bool
	if cfg.SQPoll {
		before = taskIDs()
	}
	fd, err := sysSetup(sqN, &p)
	if err != nil {
		r.freeMem()
		return nil, setupError(cfg, p.Flags, err)
	}
	r.fd, r.p, r.features = fd, p, p.Features
	if err := r.mapRings(); err != nil {
		unix.Close(fd)
		r.freeMem()
		return nil, err
	}
	if cfg.SQPoll {
		r.sqCandidates = newTasks(before)
	}
	maxIn := cfg.MaxInFlight
	if maxIn <= 0 || maxIn > int(r.p.CQEntries) {
		maxIn = int(r.p.CQEntries)
	}
	r.cfg.MaxInFlight = maxIn
	r.slots = make([]*Completion, maxIn)
	r.freeSlot = make([]uint32, maxIn)
	for i := range r.freeSlot {
		r.freeSlot[i] = uint32(maxIn - 1 - i)
	}
	return r, nil
}

func flagsOf(cfg Config) uint32 {
	f := uint32(setupCQSize)
	if cfg.SQPoll {
		f |= setupSQPoll
		if cfg.SQThreadCPU >= 0 {
			f |= setupSQAff
		}
	}
	if cfg.SingleIssuer || cfg.DeferTaskrun {
		f |= setupSingleIssuer
	}
	if cfg.DeferTaskrun {
		f |= setupDeferTaskrun
	}
	if cfg.CoopTaskrun {
		f |= setupCoopTaskrun | setupTaskrunFlag
	}
	if cfg.NoMmap {
		f |= setupNoMmap
	}
	if cfg.Disabled {
		f |= setupRDisabled
	}
	return f
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

// Stats returns the counters so far.
func (r *Ring) Stats() Stats { return r.stats }

// MaxInFlight is the effective bound on I/O in the kernel.
func (r *Ring) MaxInFlight() int { return r.cfg.MaxInFlight }

// InFlight implements Engine.
func (r *Ring) InFlight() int { return r.inKernel + r.overflow.n }

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

// RegisterFiles implements Engine.
func (r *Ring) RegisterFiles(files []*File) error {
	if r.closed {
		return fmt.Errorf("uring: register files: %w", ErrClosed)
	}
	if r.InFlight() > 0 {
		return fmt.Errorf("uring: register files: %w: %d I/O in flight", ErrInvalid, r.InFlight())
	}
	if r.files != nil {
		if _, err := sysRegister(r.fd, unregisterFiles, nil, 0); err != nil {
			return fmt.Errorf("uring: unregister files: %w", err)
		}
		r.forgetFiles()
	}
	if len(files) == 0 {
		return nil
	}
	fds := make([]int32, len(files))
	for i, f := range files {
		fds[i] = f.FD
	}
	if _, err := sysRegister(r.fd, registerFiles, unsafe.Pointer(&fds[0]), uint32(len(fds))); err != nil {
		return fmt.Errorf("uring: register %d files: %w", len(files), err)
	}
	for i, f := range files {
		f.Index = int32(i)
	}
	r.files = append([]*File(nil), files...)
	return nil
}

// forgetFiles resets the Index of the files this ring registered.
func (r *Ring) forgetFiles() {
	for i, f := range r.files {
		if f.Index == int32(i) {
			f.Index = -1
		}
	}
	r.files = nil
}

// Enable enables a ring created with Config.Disabled
// (IORING_REGISTER_ENABLE_RINGS). With SingleIssuer or DeferTaskrun the
// calling OS thread becomes the only one that may submit to, wait on or
// register with the ring from then on: lock the goroutine to its thread
// first (runtime.LockOSThread) and keep it locked. Enabling a ring that is
// not disabled fails (EBADFD from the kernel).
func (r *Ring) Enable() error {
	if r.closed {
		return fmt.Errorf("uring: enable ring: %w", ErrClosed)
	}
	if _, err := sysRegister(r.fd, registerEnable, nil, 0); err != nil {
		return fmt.Errorf("uring: enable ring: %w", err)
	}
	return nil
}

// RegisterBuffers implements Engine. The buffers must stay allocated until
// the ring is closed or RegisterBuffers(nil) unregisters them.
func (r *Ring) RegisterBuffers(bufs []*Buffer) error {
	if r.closed {
		return fmt.Errorf("uring: register buffers: %w", ErrClosed)
	}
	if r.InFlight() > 0 {
		return fmt.Errorf("uring: register buffers: %w: %d I/O in flight", ErrInvalid, r.InFlight())
	}
	if r.bufs != nil {
		if _, err := sysRegister(r.fd, unregisterBuffers, nil, 0); err != nil {
			return fmt.Errorf("uring: unregister buffers: %w", err)
		}
		r.bufs = nil
	}
	if len(bufs) == 0 {
		return nil
	}
	iov := make([]iovec, len(bufs))
	for i, b := range bufs {
		if b == nil || b.mem == nil {
			return fmt.Errorf("uring: register buffers: %w: buffer %d is freed", ErrInvalid, i)
		}
		iov[i] = iovec{Base: uint64(b.Addr()), Len: uint64(b.Len())}
	}
	if _, err := sysRegister(r.fd, registerBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov))); err != nil {
		if err == unix.ENOMEM {
			return fmt.Errorf("uring: register %d buffers: %w (RLIMIT_MEMLOCK too low?)", len(bufs), err)
		}
		return fmt.Errorf("uring: register %d buffers: %w", len(bufs), err)
	}
	r.bufs = append([]*Buffer(nil), bufs...)
	return nil
}

// Close implements Engine.
func (r *Ring) Close() error {
	if r.closed {
		return fmt.Errorf("uring: close: %w", ErrClosed)
	}
	if n := r.InFlight(); n > 0 {
		return fmt.Errorf("uring: close: %w: %d I/O in flight (Flush them first)", ErrInvalid, n)
	}
	r.closed = true
	r.forgetFiles()
	r.bufs = nil
	err := unix.Close(r.fd)
	r.freeMem()
	r.sqes, r.cqes, r.sqArray = nil, nil, nil
	if err != nil {
		return fmt.Errorf("uring: close: %w", err)
	}
	return nil
}

var _ Engine = (*Ring)(nil)

func (r *Ring) needsWakeup() bool { return atomic.LoadUint32(r.sqFlags)&sqNeedWakeup != 0 }
