package uring

import (
	"fmt"
	"math/bits"
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

// Stats returns the counters so far.
func (r *Ring) Stats() Stats { return r.stats }

// MaxInFlight is the effective bound on I/O in the kernel.
func (r *Ring) MaxInFlight() int { return r.cfg.MaxInFlight }

// InFlight implements Engine.
func (r *Ring) InFlight() int { return r.inKernel + r.overflow.n }

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
