// Package gpu is PathGPU's mover: package kernels restores. The GPU drives
// its own io_uring (one read per (layer, extent), in the kernels' staging),
// scatters into the engine's KV tensors in HBM and marks layers ready with
// CUDA events. Saves gather pages from HBM into the store's
// (CUDA-registered) staging slots, the GPU checksumming every page plane as
// it gathers, and are written from there by the store's ring like
// PathCPU's. A restore is one scheduler job (Whole) that holds its devices'
// reads from dispatch until the GPU reports each layer done.
package gpu

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime/internal/iosched"
	"github.com/tutti-io/tutti/runtime/internal/mover"
	"github.com/tutti-io/tutti/runtime/internal/staging"
	"github.com/tutti-io/tutti/uring"
)

// Config is what the mover works with: the KV shape, the GPU settings
// (runtime.GPUConfig's, defaults filled in), and the store's shared parts,
// which outlive the mover.
type Config struct {
	Geometry kvshape.Geometry
	Layout   kvshape.Layout
	// Pool is where the store's runs lie (every extent's file and offset).
	Pool     mover.Pool
	NumPages int

	Device     int
	MaxPages   int
	MaxRuns    int
	IOWindow   int
	MaxIOBytes int
	Lookahead  int
	SQPoll     bool
	// QueueDepth is the store's; the GPU ring's queue holds at least it.
	QueueDepth int

	Staging  *staging.Pool
	Sched    *iosched.Scheduler
	Counters *mover.Counters
	// Bind, if set (tests), binds the restorer instead of package kernels:
	// no ring is made and no staging is registered with CUDA.
	Bind func(kv []mover.Region) (Restorer, error)
}

// Available initialises the kernels on device, or says why it cannot.
func Available(device int) error { return kernels.Init(device) }

// Mover is PathGPU's mover.Mover.
type Mover struct {
	cfg Config
	// Set once by Bind.
	r     Restorer
	ring  *uring.Ring // nil with Config.Bind
	lanes chan int    // the restorer's free gather lanes: a stage worker holds one per gather
	// restoreSlots holds a token per restore live on the GPU (submitted,
	// not released): the kernels take kernels.Config.MaxRequests at once
	// and refuse one more (ErrBusy), where the store takes MaxLoads loads.
	restoreSlots chan struct{}
	// planeShift combines the GPU's plane CRCs of a save's gathers into
	// chunk CRCs (the plane length's objmap.CRCShift).
	planeShift *objmap.CRCShift
	slots      []uintptr // staging slots registered with CUDA
	// kickFallback: why the kick-mode ring has no DEFER_TASKRUN (empty: it
	// has, or the ring is SQPOLL), reported in Status.
	kickFallback string
	closed       bool // Close ran since the last Bind
}

// New is the mover of cfg; nothing is bound until Bind.
func New(cfg Config) *Mover { return &Mover{cfg: cfg} }

// Bind binds the engine's device KV tensors, a ring dedicated to the GPU
// and the store's staging slots (for save gathers).
func (m *Mover) Bind(kv []mover.Region) error {
	cfg := m.cfg
	if cfg.Bind != nil {
		r, err := cfg.Bind(kv)
		if err != nil {
			return fmt.Errorf("binding the GPU: %w", err)
		}
		return m.bound(r)
	}
	ptrs := make([]uint64, len(kv))
	for i, r := range kv {
		ptrs[i] = uint64(r.Addr)
	}
	rc := uring.DefaultConfig()
	// The queue holds the window (uring.New rounds it up to a power of two).
	rc.Entries = uint32(max(64, cfg.QueueDepth, cfg.IOWindow))
	// Without SQPOLL the kernels' helper thread submits and runs the
	// completions' task work (kick mode), on a DEFER_TASKRUN ring where the
	// kernel allows it; nothing else enters this ring.
	var ring *uring.Ring
	var err error
	var fallback string
	if cfg.SQPoll {
		rc.SQPoll = true
		rc.SQThreadIdleMs = 20
		ring, err = uring.New(rc)
	} else {
		ring, fallback, err = kernels.NewKickRing(rc)
	}
	if err != nil {
		return fmt.Errorf("GPU ring: %w", err)
	}
	r, err := kernels.Bind(KernelsConfig(cfg, ptrs, ring))
	if err != nil {
		ring.Close()
		return fmt.Errorf("binding the GPU: %w", err)
	}
	if err := m.bound(kernelsRestorer{r}); err != nil {
		ring.Close()
		return err
	}
	m.ring, m.kickFallback = ring, fallback
	for _, sl := range cfg.Staging.Slots() {
		if err := kernels.HostRegister(sl.Buf.Addr(), int64(sl.Buf.Len())); err != nil {
			_ = m.Close()
			return fmt.Errorf("registering staging with CUDA: %w", err)
		}
		m.slots = append(m.slots, sl.Buf.Addr())
	}
	return nil
}

// KernelsConfig is what the mover binds the kernels with: KV tensors ptrs,
// ring ring.
func KernelsConfig(cfg Config, ptrs []uint64, ring *uring.Ring) kernels.Config {
	return kernels.Config{Device: cfg.Device, Geometry: cfg.Geometry, Layout: cfg.Layout,
		NumPages: cfg.NumPages, KV: ptrs, Ring: ring, MaxPages: cfg.MaxPages, MaxExtents: cfg.MaxExtents(),
		IOWindow: cfg.IOWindow, MaxIOBytes: cfg.MaxIOBytes, Lookahead: cfg.Lookahead}
}

// MaxRestores is how many restores the kernels bound for cfg take live at
// once (kernels.Config.MaxRequests, as KernelsConfig leaves it); the mover
// queues the store's other loads until one is released.
func MaxRestores(cfg Config) int {
	return max(1, kernels.PlanLimits(KernelsConfig(cfg, nil, nil)).MaxRequests)
}

// bound takes restorer r with all its gather lanes free. On an error it
// closes r.
func (m *Mover) bound(r Restorer) error {
	n := r.GatherLanes()
	if n < 1 {
		r.Close()
		return fmt.Errorf("binding the GPU: the restorer has %d gather lanes", n)
	}
	m.r, m.lanes, m.closed = r, make(chan int, n), false
	m.restoreSlots = make(chan struct{}, MaxRestores(m.cfg))
	m.planeShift = objmap.NewCRCShift(m.cfg.Geometry.PageBytesPerPlane())
	for i := range n {
		m.lanes <- i
	}
	return nil
}

// Close unregisters the staging and closes the restorer and its ring
// (every restore released, every gather done). A second Close, or one
// before Bind, does nothing; Status still answers after it.
func (m *Mover) Close() error {
	if m.r == nil || m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	for _, a := range m.slots {
		errs = append(errs, kernels.HostUnregister(a))
	}
	errs = append(errs, m.r.Close())
	if m.ring != nil {
		errs = append(errs, m.ring.Close())
	}
	m.ring, m.slots = nil, nil
	return errors.Join(errs...)
}

// WriteUnit is the size GPU save writes are cut at: whole pages (a gather
// copies pages) and whole O_DIRECT blocks.
func WriteUnit(g kvshape.Geometry) int64 { return mover.BlockMultiple(g.PageBytesPerLayer()) }

// SaveSlots is every slot: restores stage in the kernels' memory.
func (m *Mover) SaveSlots(slots int) int { return slots }

// Whole is true: a restore is one request to the GPU, which drives its own
// queue.
func (m *Mover) Whole() bool { return true }

// Cut trims runs to what one GPU restore can take (MaxRuns extents,
// MaxPages pages, extents starting on an O_DIRECT boundary) and returns
// the blocks kept.
func (m *Mover) Cut(runs []mover.Run, cached int) int {
	g := m.cfg.Geometry
	kept, pages := 0, 0
	for i, r := range runs {
		if kept >= cached || i >= m.cfg.MaxRuns || (int64(r.First)*g.ChunkBytesPerLayer())%objmap.BlockBytes != 0 {
			break
		}
		k := min(r.K, cached-kept, (m.cfg.MaxPages-pages)/g.ChunkPages)
		if k <= 0 {
			break
		}
		kept += k
		pages += k * g.ChunkPages
	}
	return kept
}

// Status is the bound GPU's state for the store's Stats.
type Status struct {
	// Fixed: reads go to registered staging (READ_FIXED); FixedErr why
	// not, where they were asked to.
	Fixed    bool
	FixedErr error
	// KickFallback says why the kick-mode ring is woken by every
	// completion ("" : batched, or SQPOLL).
	KickFallback string
	// Wakeups and BatchTimeouts are the ring helper's
	// (kernels.Restorer.Wakeups, BatchTimeouts).
	Wakeups, BatchTimeouts int64
}

// Status is the bound GPU's state; ok false before Bind.
func (m *Mover) Status() (st Status, ok bool) {
	if m.r == nil {
		return st, false
	}
	st.Fixed, st.FixedErr = m.r.FixedBuffers()
	st.KickFallback = m.kickFallback
	st.Wakeups, st.BatchTimeouts = m.r.Wakeups(), m.r.BatchTimeouts()
	return st, true
}
