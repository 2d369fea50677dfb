package kernels

/*
#include <stdlib.h>
#include "tutti_kernels.h"
tk_status tkl_bind(const tk_bind_params *p, uint64_t *c);
tk_status tkl_unbind(uint64_t c);
tk_status tkl_restore_submit(uint64_t c, const tk_restore_params *p, uint32_t *r);
tk_status tkl_restore_enqueue(uint64_t c, uint32_t r, uint32_t u);
tk_status tkl_restore_stream_wait(uint64_t c, uint32_t r, uint32_t l, uint64_t s);
tk_status tkl_restore_wait_layer(uint64_t c, uint32_t r, uint32_t l);
tk_status tkl_restore_wait(uint64_t c, uint32_t r, tk_entry_result *res, uint32_t n, float *ms, uint32_t nm);
tk_status tkl_restore_release(uint64_t c, uint32_t r);
tk_status tkl_host_map(uint64_t c, const tk_page_map *m, uint32_t n);
tk_status tkl_scatter_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_gather_host(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_scatter_dev(uint64_t c, uint32_t l, uint64_t a, uint64_t n);
tk_status tkl_copy_event(uint64_t c, uint32_t i);
tk_status tkl_copy_event_wait(uint64_t c, uint32_t i);
tk_status tkl_sync(uint64_t c);
tk_status tkl_kv_fill(uint64_t c, uint32_t v);
tk_status tkl_kv_verify(uint64_t c, uint64_t seed, const tk_page_map *m, uint32_t n, uint32_t fl, uint32_t nl, uint64_t *out);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/uring"
	"golang.org/x/sys/unix"
)

// The Go mirrors must have the C sizes (they are passed as arrays).
var (
	_ [unsafe.Sizeof(C.tk_io_entry{}) - unsafe.Sizeof(ioEntry{})]struct{}
	_ [unsafe.Sizeof(ioEntry{}) - unsafe.Sizeof(C.tk_io_entry{})]struct{}
	_ [unsafe.Sizeof(C.tk_page_map{}) - unsafe.Sizeof(PageMap{})]struct{}
	_ [unsafe.Sizeof(PageMap{}) - unsafe.Sizeof(C.tk_page_map{})]struct{}
	_ [unsafe.Sizeof(C.tk_entry_result{}) - unsafe.Sizeof(EntryResult{})]struct{}
	_ [unsafe.Sizeof(EntryResult{}) - unsafe.Sizeof(C.tk_entry_result{})]struct{}
)

// Config describes what Bind allocates and binds. Zero fields take the
// defaults named.
type Config struct {
	Device   int
	Geometry objmap.Geometry // ChunkPages is not used
	Layout   Layout
	NumPages int      // engine pages in each KV tensor
	KV       []uint64 // device pointers: Geometry.Layers tensors (per-layer) or one (cross-layer)

	// Ring is a ring dedicated to the GPU (nothing else may Submit to it while
	// bound); nil binds host copies only (CPU-issued I/O paths). With SQPOLL
	// the kernel thread submits and the helper only wakes it; without, the
	// helper enters the kernel once per WakeInterval (kick mode).
	//
	// A kick-mode ring created with uring.Config{DeferTaskrun: true,
	// Disabled: true} is the cheapest on the CPU: Bind hands it to the
	// helper's thread, which registers the staging pool, enables the ring
	// (becoming its single issuer) and is then woken by the kernel once per
	// batch of completions instead of once per completion. Such a ring must
	// not be used by anything else while bound, not even to register.
	Ring *uring.Ring

	MaxPages     int           // pages per request (required)
	MaxExtents   int           // extents per layer per request; 64
	MaxIOBytes   int           // largest single read; 1 MiB (multiple of 4096)
	StagingSlots int           // layer slots of the pinned staging pool; Lookahead+3
	MaxRequests  int           // requests in flight; 4
	IOWindow     int           // SQEs in flight; 128 (capped by the ring's SQ and CQ)
	Lookahead    int           // layers beyond the one waited for that may be in flight; 1
	PollTimeout  time.Duration // no completion for this long: entries time out, the ring breaks; 5 s
	WakeInterval time.Duration // SQPOLL: how often the helper looks at the flags; kick mode: wait while nothing is in flight; 50 µs
	WakeBatch    int           // kick mode: most completions one wake-up of the helper waits for; 32 (1: every completion)
	BatchWait    time.Duration // kick mode: longest wait for a batch while I/O is in flight; 4 ms
	// WakeRamp (kick mode): when a restore begins, the helper's batch starts
	// at 1 and grows by one every WakeRamp completions up to WakeBatch, so
	// the first layer is seen as soon as its reads are done; 8 (-1: no
	// ramp, a full batch from the first wait).
	WakeRamp      int
	SlotBytesHint int64 // staging slot size; derived from MaxPages and MaxExtents
	// EnqueueLayers is how many layers of a restore are on the GPU's streams
	// ahead of the last one scattered; Restore enqueues that many and a
	// feeder goroutine the rest (feed.go: enqueueing blocks once the GPU's
	// command queue is full, about 60 layers). 2×(Lookahead+3), at least 16,
	// at most 48.
	EnqueueLayers int
	// EnqueueChunk is how many layers the feeder enqueues per wake-up (it
	// waits for layer l-EnqueueLayers+EnqueueChunk-1, then enqueues layers
	// l..l+EnqueueChunk-1): fewer host wake-ups per restore, at least
	// EnqueueLayers-EnqueueChunk+1 layers always queued. EnqueueLayers/2,
	// at least 1, at most 8; at most EnqueueLayers. Why: each wake-up of
	// the feeder costs CPU time and a chunk of layers per wake-up moves the
	// same bytes per second as one layer per wake-up.
	EnqueueChunk int
}

func (c *Config) defaults() {
	if c.MaxExtents == 0 {
		c.MaxExtents = 64
	}
	if c.MaxIOBytes == 0 {
		c.MaxIOBytes = 1 << 20
	}
	if c.Lookahead == 0 {
		c.Lookahead = 1
	}
	if c.StagingSlots == 0 {
		c.StagingSlots = c.Lookahead + 3
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 4
	}
	if c.EnqueueLayers == 0 {
		c.EnqueueLayers = min(48, max(16, 2*(c.Lookahead+3)))
	}
	if c.EnqueueChunk == 0 {
		c.EnqueueChunk = min(8, max(1, c.EnqueueLayers/2))
	}
	if c.IOWindow == 0 {
		c.IOWindow = 128
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = 5 * time.Second
	}
	if c.WakeInterval == 0 {
		c.WakeInterval = 50 * time.Microsecond
	}
	if c.WakeBatch <= 0 {
		c.WakeBatch = 32
	}
	if c.WakeRamp == 0 {
		c.WakeRamp = 8
	}
	if c.BatchWait == 0 {
		// On a slow disk a batch of 32 takes longer than this, so the
		// timeout sets the wake-up rate there, and a shorter one costs CPU
		// time in wake-ups. A layer's last completions may wait this long;
		// layers of such a disk take far longer.
		c.BatchWait = 4 * time.Millisecond
	}
}

// checkFeed checks the feeder's settings (after defaults).
func (c *Config) checkFeed() error {
	if c.EnqueueLayers < 1 || c.EnqueueChunk < 0 || c.EnqueueChunk > c.EnqueueLayers {
		return fmt.Errorf("EnqueueLayers %d, EnqueueChunk %d: want EnqueueLayers ≥ 1 and EnqueueChunk in [0, EnqueueLayers]: %w",
			c.EnqueueLayers, c.EnqueueChunk, ErrInvalid)
	}
	return nil
}

// Restorer is a bound context: KV tensors, staging pool, ring, streams and
// every descriptor buffer, allocated once by Bind. Its methods are safe for
// concurrent use.
type Restorer struct {
	cfg     Config
	opts    BenchOptions
	lim     Limits
	ctx     C.uint64_t
	staging *uring.Buffer
	ring    *uring.Ring

	mu      sync.Mutex // serializes calls that change the context
	plans   []*Plan    // free descriptor buffers, one per request slot (a restore holds one until submitted)
	live    int        // restores not yet released: at most MaxRequests, so a submit always finds a slot
	feed    *feeder    // enqueues long restores' layers as earlier ones finish
	slots   []reqSlot  // per request slot: the entries (for error reports) and results
	closed  bool
	helper  helperState // restores live, the kick loop's state (C memory)
	kick    chan struct{}
	stop    chan struct{}
	waker   sync.WaitGroup
	wakeErr atomic.Pointer[error]
	wakes   atomic.Int64
	// fixed: the staging slots are the ring's registered buffers 0..n-1;
	// fixedErr: why they are not (nil when fixed or not asked for).
	fixed    bool
	fixedErr error
	// owned: the ring was handed to the helper's thread (created disabled,
	// enabled there): registration happens on that thread only.
	owned    bool
	unregErr error // the helper's unregistering of the staging pool (read after waker.Wait)
}

type reqSlot struct {
	pages   []PageMap
	entries []ioEntry
	extents []int32 // Plan.EntryExtent
	results []EntryResult
	layerMs []float32
}

// Bind allocates the staging pool (off-heap, registered with CUDA), binds the
// KV tensors and the ring, and starts the wake helper. Close releases all.
func Bind(cfg Config) (*Restorer, error) { return BindBench(cfg, BenchOptions{}) }

// BindBench is Bind with benchmark-only A/B switches (bench.go); only a
// benchmark comparing the defaults with their baselines calls it.
func BindBench(cfg Config, opts BenchOptions) (*Restorer, error) {
	cfg.defaults()
	if err := Init(cfg.Device); err != nil {
		return nil, err
	}
	g := cfg.Geometry
	if err := checkGeometry(g); err != nil {
		return nil, fmt.Errorf("binding kernels: %w", err)
	}
	want := g.Layers
	if cfg.Layout == LayoutCrossLayer {
		want = 1
	}
	if len(cfg.KV) != want || cfg.NumPages <= 0 || cfg.MaxPages <= 0 || cfg.MaxIOBytes%StagingAlign != 0 {
		return nil, fmt.Errorf("binding kernels: %d KV tensors (want %d), %d pages, %d max pages, %d max I/O bytes: %w",
			len(cfg.KV), want, cfg.NumPages, cfg.MaxPages, cfg.MaxIOBytes, ErrInvalid)
	}
	if err := cfg.checkFeed(); err != nil {
		return nil, fmt.Errorf("binding kernels: %w", err)
	}
	slotBytes := stagingSlotBytes(cfg, g)
	lim := Limits{Layers: g.Layers, NumPages: cfg.NumPages, MaxPages: cfg.MaxPages, SlotBytes: slotBytes,
		MaxIOBytes: cfg.MaxIOBytes, MaxEntries: int((slotBytes+int64(cfg.MaxIOBytes)-1)/int64(cfg.MaxIOBytes)) + cfg.MaxExtents}
	staging, err := uring.AllocBuffer(int(slotBytes) * cfg.StagingSlots)
	if err != nil {
		return nil, fmt.Errorf("binding kernels: staging pool: %w", err)
	}
	p := (*C.tk_bind_params)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tk_bind_params{}))))
	defer C.free(unsafe.Pointer(p))
	p.abi_version = C.TK_ABI_VERSION
	p.device = C.int32_t(cfg.Device)
	p.kv.layers = C.uint32_t(g.Layers)
	p.kv.planes = C.uint32_t(g.Planes)
	p.kv.page_tokens = C.uint32_t(g.PageTokens)
	p.kv.kv_heads = C.uint32_t(g.KVHeads)
	p.kv.head_dim = C.uint32_t(g.HeadDim)
	p.kv.dtype_bytes = C.uint32_t(g.DType.Bytes())
	p.kv.layout = C.uint32_t(cfg.Layout)
	p.kv.num_pages = C.uint32_t(cfg.NumPages)
	for i, ptr := range cfg.KV {
		p.kv.kv_ptrs[i] = C.uint64_t(ptr)
	}
	p.staging_addr = C.uint64_t(staging.Addr())
	p.staging_bytes = C.uint64_t(slotBytes * int64(cfg.StagingSlots))
	p.staging_slots = C.uint32_t(cfg.StagingSlots)
	p.max_pages = C.uint32_t(cfg.MaxPages)
	p.max_entries = C.uint32_t(lim.MaxEntries)
	p.max_requests = C.uint32_t(cfg.MaxRequests)
	p.io_window = C.uint32_t(cfg.IOWindow)
	p.lookahead = C.uint32_t(cfg.Lookahead)
	p.poll_timeout_ns = C.uint64_t(cfg.PollTimeout.Nanoseconds())
	if opts.ZeroCopyScatter {
		p.zero_copy_scatter = 1
	}
	if cfg.Ring != nil {
		rd := (*C.tk_ring)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tk_ring{}))))
		defer C.free(unsafe.Pointer(rd))
		if err := fillRing(rd, cfg.Ring.Layout()); err != nil {
			staging.Free()
			return nil, fmt.Errorf("binding kernels: %w", err)
		}
		p.ring = rd
	}
	r := &Restorer{cfg: cfg, opts: opts, lim: lim, staging: staging, ring: cfg.Ring, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	if err := status("tk_bind", C.tkl_bind(p, &r.ctx)); err != nil {
		staging.Free()
		return nil, fmt.Errorf("binding kernels: %w", err)
	}
	r.owned = r.ring != nil && r.ring.Layout().SetupFlags&setupRDisabled != 0
	if r.ring != nil && !opts.NoFixedBuffers && !r.owned {
		r.fixedErr = r.registerStaging(slotBytes)
		r.fixed = r.fixedErr == nil
	}
	r.helper = newHelperState()
	r.slots = make([]reqSlot, cfg.MaxRequests)
	for i := range r.slots {
		r.slots[i] = reqSlot{
			pages:   make([]PageMap, 0, cfg.MaxPages),
			entries: make([]ioEntry, 0, g.Layers*lim.MaxEntries),
			results: make([]EntryResult, g.Layers*lim.MaxEntries),
			layerMs: make([]float32, g.Layers),
		}
	}
	for range cfg.MaxRequests {
		r.plans = append(r.plans, &Plan{})
	}
	if r.ring != nil {
		ready := make(chan error, 1)
		r.waker.Add(1)
		go r.wakeLoop(slotBytes, ready)
		if err := <-ready; err != nil {
			r.waker.Wait()
			r.helper.free()
			C.tkl_unbind(r.ctx)
			staging.Free()
			return nil, fmt.Errorf("binding kernels: %w", err)
		}
		r.feed = newFeeder(cFeed{r}, &r.mu, cfg.EnqueueLayers, cfg.EnqueueChunk)
	}
	return r, nil
}

// stagingSlotBytes is the size of one staging slot: the hint, or room for
// MaxPages pages plus one alignment block per extent; a multiple of
// StagingAlign, and of 2 MiB once it is that large. Why 2 MiB: the pool is
// huge-page backed (uring.AllocBuffer), and a slot registered with the ring
// that starts on a huge page is one segment per 2 MiB to the block layer; a
// slot starting 4 KiB into one sends reads to io-wq workers on some block
// devices (the kernel then splits them).
func stagingSlotBytes(cfg Config, g objmap.Geometry) int64 {
	n := cfg.SlotBytesHint
	if n == 0 {
		n = roundUp(int64(cfg.MaxPages)*g.PageBytesPerLayer(), StagingAlign) + int64(cfg.MaxExtents)*StagingAlign
	}
	n = roundUp(n, StagingAlign)
	if n >= hugePageBytes {
		n = roundUp(n, hugePageBytes)
	}
	return n
}

const hugePageBytes = 2 << 20

func fillRing(rd *C.tk_ring, l uring.RingLayout) error {
	if len(l.Regions) == 0 || len(l.Regions) > C.TK_MAX_RING_REGIONS {
		return fmt.Errorf("ring with %d memory regions: %w", len(l.Regions), ErrInvalid)
	}
	rd.sq_head = C.uint64_t(l.SQHead)
	rd.sq_tail = C.uint64_t(l.SQTail)
	rd.sq_mask = C.uint64_t(l.SQMask)
	rd.sq_flags = C.uint64_t(l.SQFlags)
	rd.sq_array = C.uint64_t(l.SQArray)
	rd.sqes = C.uint64_t(l.SQEs)
	rd.cq_head = C.uint64_t(l.CQHead)
	rd.cq_tail = C.uint64_t(l.CQTail)
	rd.cq_mask = C.uint64_t(l.CQMask)
	rd.cqes = C.uint64_t(l.CQEs)
	rd.sq_entries = C.uint32_t(l.SQEntries)
	rd.cq_entries = C.uint32_t(l.CQEntries)
	rd.sqe_bytes = C.uint32_t(l.SQESize)
	rd.cqe_bytes = C.uint32_t(l.CQESize)
	rd.ring_fd = C.int32_t(l.FD)
	rd.n_regions = C.uint32_t(len(l.Regions))
	for i, g := range l.Regions {
		// Registration works on whole pages; ring mappings are page aligned.
		rd.region_addr[i] = C.uint64_t(g.Addr)
		rd.region_bytes[i] = C.uint64_t(roundUp(int64(g.Len), 4096))
	}
	return nil
}

// wakeLoop is the CPU helper of the GPU ring: while a restore is live it looks
// at the SQPOLL thread's flags every WakeInterval and enters the kernel only
// when the thread sleeps (IORING_SQ_NEED_WAKEUP), so the per-I/O path stays on
// the GPU.
//
// A ring without SQPOLL is driven in kick mode instead: by the C loop of
// kickloop.go (runKickLoop), woken by completions, or, on a kernel without
// IORING_FEAT_EXT_ARG, by this loop entering the kernel once per interval.
//
// ready receives nil once the helper runs, or why it cannot (then it has
// returned). A ring created disabled is set up here, on the helper's locked
// thread: the staging pool is registered, the ring enabled (this thread
// becomes its single issuer) and, when the helper stops, unregistered.
func (r *Restorer) wakeLoop(slotBytes int64, ready chan<- error) {
	defer r.waker.Done()
	l := r.ring.Layout()
	kick := l.SetupFlags&setupSQPoll == 0
	if kick || r.owned {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	if r.owned {
		if !r.opts.NoFixedBuffers {
			r.fixedErr = r.registerStaging(slotBytes)
			r.fixed = r.fixedErr == nil
		}
		if err := r.ring.Enable(); err != nil {
			if r.fixed {
				r.ring.RegisterBuffers(nil)
			}
			ready <- fmt.Errorf("enabling the GPU ring on the helper thread: %w", err)
			return
		}
		defer func() {
			if r.fixed {
				// The pages stay pinned by the ring until unregistered, and
				// only this thread may unregister them.
				r.unregErr = r.ring.RegisterBuffers(nil)
			}
		}()
	}
	ready <- nil
	if kick && l.Features&featExtArg != 0 {
		r.helper.runKickLoop(l, r.cfg.WakeInterval, r.cfg.BatchWait, r.cfg.WakeBatch, r.cfg.WakeRamp, !r.opts.LooseWakeTarget)
		return
	}
	t := time.NewTicker(r.cfg.WakeInterval)
	defer t.Stop()
	for {
		if !r.helper.active() {
			select {
			case <-r.kick:
			case <-r.stop:
				return
			}
		}
		var woke bool
		var err error
		if kick {
			woke, err = true, enter(l.FD, l.SQEntries, l.EnterGetEvents)
		} else {
			woke, err = r.ring.WakeIfNeeded()
		}
		if err != nil {
			r.wakeErr.Store(&err)
		}
		if woke {
			r.wakes.Add(1)
		}
		select {
		case <-t.C:
		case <-r.stop:
			return
		}
	}
}

const (
	setupSQPoll       = 1 << 1  // IORING_SETUP_SQPOLL
	setupRDisabled    = 1 << 6  // IORING_SETUP_R_DISABLED
	setupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN
	featExtArg        = 1 << 8  // IORING_FEAT_EXT_ARG: io_uring_enter takes a wait timeout
)

func enter(fd int, toSubmit, flags uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit), 0, uintptr(flags), 0, 0)
	if e != 0 && e != unix.EINTR && e != unix.EAGAIN && e != unix.EBUSY {
		return fmt.Errorf("io_uring_enter (kick): %w", e)
	}
	return nil
}

// registerStaging registers each staging slot with the ring as fixed buffer
// number slot. Nothing is in flight on the ring yet (Bind owns it).
func (r *Restorer) registerStaging(slotBytes int64) error {
	n := r.cfg.StagingSlots
	if n > 1<<16 {
		return fmt.Errorf("registering %d staging slots as fixed buffers: more than the SQE's 16-bit buffer index: %w", n, ErrInvalid)
	}
	views := make([]*uring.Buffer, n)
	for i := range views {
		v, err := r.staging.View(i*int(slotBytes), int(slotBytes))
		if err != nil {
			return fmt.Errorf("registering staging slot %d as a fixed buffer: %w", i, err)
		}
		views[i] = v
	}
	if err := r.ring.RegisterBuffers(views); err != nil {
		return fmt.Errorf("registering %d staging slots of %d bytes as fixed buffers: %w", n, slotBytes, err)
	}
	return nil
}

// FixedBuffers reports whether the GPU issues READ_FIXED into registered
// staging slots, and if it does not although asked to, why (the restore
// then runs with plain reads: slower on the CPU, the same bytes).
func (r *Restorer) FixedBuffers() (bool, error) { return r.fixed, r.fixedErr }

// Wakeups counts the times the helper had to wake the SQPOLL thread (or, in
// kick mode, entered the kernel).
func (r *Restorer) Wakeups() int64 { return r.wakes.Load() + r.helper.enters() }

// WakeTimeouts counts the kick loop's waits that ended on their timeout
// rather than on a batch of completions (part of Wakeups).
func (r *Restorer) WakeTimeouts() int64 { return r.helper.timeouts() }

// BatchTimeouts counts the kick loop's waits that ran the whole BatchWait
// with I/O in flight (part of WakeTimeouts; the rest are idle waits and,
// without BenchOptions.LooseWakeTarget, short waits for a single completion).
func (r *Restorer) BatchTimeouts() int64 { return r.helper.batchTimeouts() }

// HelperMode says how the CPU helper drives the ring: "sqpoll-wake" (it
// only wakes the SQPOLL thread), "kick-wait" (the C loop, woken by
// completions) or "kick-timer" (a kernel without IORING_FEAT_EXT_ARG: one
// io_uring_enter per WakeInterval, more CPU; reported, never silent).
func (r *Restorer) HelperMode() string {
	if r.ring == nil {
		return ""
	}
	l := r.ring.Layout()
	switch {
	case l.SetupFlags&setupSQPoll != 0:
		return "sqpoll-wake"
	case l.Features&featExtArg != 0 && l.SetupFlags&setupDeferTaskrun != 0:
		return "kick-wait, deferred task work"
	case l.Features&featExtArg != 0:
		return "kick-wait"
	}
	return "kick-timer"
}

// HelperTID is the OS thread id of the kick loop (0 before it started, or
// on a SQPOLL ring): its CPU time is the helper's share of the process's.
func (r *Restorer) HelperTID() int { return r.helper.tid() }

// HelperErr is the last error of the CPU helper's io_uring_enter calls (nil
// if none). The GPU sees such a failure only as entries that time out; this
// says why.
func (r *Restorer) HelperErr() error {
	if err := r.helper.err(); err != nil {
		return err
	}
	if e := r.wakeErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Limits are the bounds every request is checked against.
func (r *Restorer) Limits() Limits { return r.lim }

// Config returns the configuration r was bound with, defaults filled in
// (the KV tensors and device a caller checks or fills, e.g. package testkit).
func (r *Restorer) Config() Config { return r.cfg }

// Staging is the pinned staging pool: StagingSlots slots of Limits().SlotBytes.
// Host-issued paths may read into it and scatter from it (ScatterHost).
func (r *Restorer) Staging() *uring.Buffer { return r.staging }

// Close waits for the GPU, unbinds and frees the staging pool. Restores must
// have been released.
func (r *Restorer) Close() error {
	if r.feed != nil {
		r.feed.stop() // before mu: a restore still being fed needs it
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	close(r.stop)
	r.helper.stop()
	r.waker.Wait()
	r.helper.free()
	err := status("tk_unbind", C.tkl_unbind(r.ctx))
	if r.owned {
		if err == nil && r.unregErr != nil {
			err = fmt.Errorf("unregistering the staging pool: %w", r.unregErr)
		}
	} else if r.fixed {
		// The pages stay pinned by the ring until unregistered.
		if uerr := r.ring.RegisterBuffers(nil); err == nil && uerr != nil {
			err = fmt.Errorf("unregistering the staging pool: %w", uerr)
		}
	}
	if ferr := r.staging.Free(); err == nil {
		err = ferr
	}
	return err
}

// Restore is one GPU-driven restore in flight.
type Restore struct {
	r        *Restorer
	f        feedItem // its enqueue state and layers; f.id is the library's request id
	epl      int
	released bool
}

// Restore checks req, builds its descriptors and puts them on the GPU: it
// enqueues the first EnqueueLayers layers (each the GPU I/O kernel and the
// scatter kernel) and returns; the feeder enqueues the others as earlier
// layers finish. While an earlier restore still has layers to enqueue, req
// waits in the feeder's queue and Restore returns at once. The caller must
// call Release (after Wait, or to abandon it). ErrBusy: MaxRequests
// restores are live.
func (r *Restorer) Restore(req Request) (*Restore, error) {
	if r.ring == nil {
		return nil, fmt.Errorf("restore: %w: bound without a ring", ErrNotSupported)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("restore: %w: restorer closed", ErrInvalid)
	}
	if r.live >= r.cfg.MaxRequests || len(r.plans) == 0 {
		return nil, fmt.Errorf("restore: %d restores live: %w", r.live, ErrBusy)
	}
	pl := r.plans[len(r.plans)-1]
	if err := BuildPlan(r.cfg.Geometry, r.lim, req, pl); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	r.plans = r.plans[:len(r.plans)-1]
	if r.fixed {
		for i := range pl.Entries {
			pl.Entries[i].Flags |= ioFixedBuf
		}
	}
	// The wake helper must run before the layers are enqueued: the first
	// layer's I/O kernel only finishes if the SQPOLL thread is woken (or the
	// ring kicked), and enqueueing can block until then.
	if r.helper.begin() {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	x := &Restore{r: r, f: feedItem{first: req.FirstLayer, layers: len(req.Layers), plan: pl}, epl: pl.EntriesPerLayer}
	r.live++
	if err := r.feed.start(&x.f); err != nil {
		// Never submitted (a submit that fails gives its plan back itself):
		// x.f is ours again, and the feeder never saw it.
		r.live--
		r.helper.end()
		r.putPlan(&x.f)
		return nil, fmt.Errorf("restore: %w", err)
	}
	return x, nil
}

// putPlan gives back the descriptors of a restore that was never submitted
// (cFeed.submit gives back the others), with r.mu held.
func (r *Restorer) putPlan(it *feedItem) {
	if it.plan != nil {
		r.plans = append(r.plans, it.plan)
		it.plan = nil
	}
}

// cFeed is the feeder's view of the library. Its submit and enqueue run with
// Restorer.mu held.
type cFeed struct{ r *Restorer }

func (c cFeed) submit(it *feedItem, layers int) error {
	r, pl := c.r, it.plan
	defer func() {
		r.plans = append(r.plans, pl) // the library copied it
		it.plan = nil
	}()
	// The parameter block points at the plan's slices: pin them for the call.
	var pin runtime.Pinner
	pin.Pin(&pl.Pages[0])
	pin.Pin(&pl.Entries[0])
	defer pin.Unpin()
	var rp C.tk_restore_params
	rp.n_pages = C.uint32_t(len(pl.Pages))
	rp.pages = (*C.tk_page_map)(unsafe.Pointer(&pl.Pages[0]))
	rp.first_layer = C.uint32_t(it.first)
	rp.n_layers = C.uint32_t(it.layers)
	rp.entries_per_layer = C.uint32_t(pl.EntriesPerLayer)
	rp.entries = (*C.tk_io_entry)(unsafe.Pointer(&pl.Entries[0]))
	rp.enqueue_layers = C.uint32_t(layers)
	var id C.uint32_t
	if err := status("tk_restore_submit", C.tkl_restore_submit(r.ctx, &rp, &id)); err != nil {
		return err
	}
	it.id = uint32(id)
	s := &r.slots[id]
	s.entries = append(s.entries[:0], pl.Entries...)
	s.extents = append(s.extents[:0], pl.EntryExtent...)
	s.pages = append(s.pages[:0], pl.Pages...)
	return nil
}

func (c cFeed) enqueue(it *feedItem, upto int) error {
	return status("tk_restore_enqueue", C.tkl_restore_enqueue(c.r.ctx, C.uint32_t(it.id), C.uint32_t(upto)))
}

func (c cFeed) waitLayer(it *feedItem, layer int) error {
	return status(fmt.Sprintf("waiting for layer %d", it.first+layer),
		C.tkl_restore_wait_layer(c.r.ctx, C.uint32_t(it.id), C.uint32_t(it.first+layer)))
}

// fed waits until layer (absolute) is enqueued: the library's waits on a
// layer not enqueued yet would not wait at all.
func (x *Restore) fed(layer int) error {
	if layer < x.f.first || layer >= x.f.first+x.f.layers {
		return fmt.Errorf("layer %d not in the restore's [%d, %d): %w", layer, x.f.first, x.f.first+x.f.layers, ErrInvalid)
	}
	return x.r.feed.waitFed(&x.f, layer-x.f.first+1)
}

// Layers is the range of layers the restore covers.
func (x *Restore) Layers() (first, n int) { return x.f.first, x.f.layers }

// StreamWaitLayer makes a CUDA stream (a cudaStream_t; 0 is the legacy
// default stream) wait until layer is in the KV tensors, with no host round
// trip: the compute of that layer can be enqueued right after.
//
// A layer the feeder has not enqueued yet is waited for on the host first
// (it is enqueued once layer-EnqueueLayers is scattered).
func (x *Restore) StreamWaitLayer(layer int, stream uintptr) error {
	if err := x.fed(layer); err != nil {
		return fmt.Errorf("waiting on layer %d in stream: %w", layer, err)
	}
	return status(fmt.Sprintf("waiting on layer %d in stream", layer),
		C.tkl_restore_stream_wait(x.r.ctx, C.uint32_t(x.f.id), C.uint32_t(layer), C.uint64_t(stream)))
}

// WaitLayer blocks until layer is scattered; it returns an error wrapping
// ErrIO if one of its entries failed (its pages were not written).
func (x *Restore) WaitLayer(layer int) error {
	if err := x.fed(layer); err != nil {
		return fmt.Errorf("waiting for layer %d: %w", layer, err)
	}
	return status(fmt.Sprintf("waiting for layer %d", layer),
		C.tkl_restore_wait_layer(x.r.ctx, C.uint32_t(x.f.id), C.uint32_t(layer)))
}

// Result is the outcome of a whole restore.
type Result struct {
	Entries         []EntryResult // layer-major; valid until Release
	EntriesPerLayer int
	LayerMs         []float32 // per layer: ms from submit until scattered
	Failed          []*EntryError
	FailedPages     int // (layer, page) pairs not written because an entry failed
}

// Wait blocks until every layer is done. err wraps ErrIO (or ErrRingBroken)
// when entries failed; Result lists them. The pages of a failed entry keep
// whatever the KV memory held before: they were never scattered.
func (x *Restore) Wait() (*Result, error) {
	if err := x.fed(x.f.first + x.f.layers - 1); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	s := &x.r.slots[x.f.id]
	n := x.f.layers * x.epl
	st := C.tkl_restore_wait(x.r.ctx, C.uint32_t(x.f.id), (*C.tk_entry_result)(unsafe.Pointer(&s.results[0])),
		C.uint32_t(n), (*C.float)(unsafe.Pointer(&s.layerMs[0])), C.uint32_t(x.f.layers))
	res := &Result{Entries: s.results[:n], EntriesPerLayer: x.epl, LayerMs: s.layerMs[:x.f.layers]}
	err := status("restore", st)
	if err != nil && !errors.Is(err, ErrIO) && !errors.Is(err, ErrRingBroken) {
		return res, err
	}
	for e, er := range res.Entries {
		if er.Status != EntryOK {
			res.Failed = append(res.Failed, &EntryError{Layer: x.f.first + e/x.epl, Entry: e % x.epl,
				Extent: int(s.extents[e%x.epl]), Offset: int64(s.entries[e].Offset), Result: er})
		}
	}
	if len(res.Failed) > 0 {
		res.FailedPages = failedPages(s.pages, res.Entries, x.epl)
		errs := make([]error, 0, 4)
		errs = append(errs, err)
		for i, f := range res.Failed {
			if i == 3 {
				errs = append(errs, fmt.Errorf("and %d more failed entries", len(res.Failed)-3))
				break
			}
			errs = append(errs, f)
		}
		return res, errors.Join(errs...)
	}
	return res, err
}

// Release frees the request slot (waiting for the GPU if it is still busy).
func (x *Restore) Release() error {
	if x.released {
		return nil
	}
	submitted := x.r.feed.waitDone(&x.f) // the feeder is done with it
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	x.released = true
	x.r.live--
	x.r.helper.end()
	if !submitted {
		x.r.putPlan(&x.f)
		return nil // never submitted (refused, or the feeder stopped first): no request to release
	}
	return status("releasing restore", C.tkl_restore_release(x.r.ctx, C.uint32_t(x.f.id)))
}

// ---- host-issued paths and saves: copies between host object layout and the KV tensors.

// SetHostMap sets the page map of the following ScatterHost/GatherHost/
// ScatterDevice calls (after the earlier ones finished).
func (r *Restorer) SetHostMap(pages []PageMap) error {
	if len(pages) == 0 {
		return fmt.Errorf("host map: %w: no pages", ErrInvalid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return status("tk_host_map", C.tkl_host_map(r.ctx, (*C.tk_page_map)(unsafe.Pointer(&pages[0])), C.uint32_t(len(pages))))
}

// ScatterHost enqueues the copy of one layer from host memory [addr,
// addr+bytes) (object layout; inside the staging pool or HostRegister'ed
// memory) into the KV tensors.
func (r *Restorer) ScatterHost(layer int, addr uintptr, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("scatter layer %d", layer), C.tkl_scatter_host(r.ctx, C.uint32_t(layer), C.uint64_t(addr), C.uint64_t(bytes)))
}

// GatherHost enqueues the copy of one layer from the KV tensors into host
// memory (object layout), for a save.
func (r *Restorer) GatherHost(layer int, addr uintptr, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("gather layer %d", layer), C.tkl_gather_host(r.ctx, C.uint32_t(layer), C.uint64_t(addr), C.uint64_t(bytes)))
}

// ScatterDevice enqueues the copy of one layer from device memory (object
// layout) into the KV tensors.
func (r *Restorer) ScatterDevice(layer int, dptr uint64, bytes int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return status(fmt.Sprintf("scatter layer %d from device", layer), C.tkl_scatter_dev(r.ctx, C.uint32_t(layer), C.uint64_t(dptr), C.uint64_t(bytes)))
}

// RecordCopy records copy event i (i < StagingSlots) after the copies enqueued so far.
func (r *Restorer) RecordCopy(i int) error {
	return status("recording copy event", C.tkl_copy_event(r.ctx, C.uint32_t(i)))
}

// WaitCopy blocks until copy event i has passed.
func (r *Restorer) WaitCopy(i int) error {
	return status("waiting for copy event", C.tkl_copy_event_wait(r.ctx, C.uint32_t(i)))
}

// SyncCopies blocks until every enqueued copy finished.
func (r *Restorer) SyncCopies() error { return status("sync copies", C.tkl_sync(r.ctx)) }

// Gather copies layers [firstLayer, firstLayer+layers) of the given engine
// pages into dst (registered host memory) in object layout, layer l at
// dst + (l-firstLayer)*layerStride, and waits. This is the save path's
// HBM -> staging step; the bytes are then written by the CPU (uring).
func (r *Restorer) Gather(pages []int32, firstLayer, layers int, dst uintptr, layerStride int64) error {
	pb := r.cfg.Geometry.PageBytesPerLayer()
	if layerStride < int64(len(pages))*pb || firstLayer < 0 || layers <= 0 || firstLayer+layers > r.cfg.Geometry.Layers {
		return fmt.Errorf("gather: %w: stride %d for %d pages, layers [%d,+%d)", ErrInvalid, layerStride, len(pages), firstLayer, layers)
	}
	pm := make([]PageMap, len(pages))
	for i, p := range pages {
		pm[i] = PageMap{DstPage: uint32(p), SlotOff: uint32(int64(i) * pb)}
	}
	if err := r.SetHostMap(pm); err != nil {
		return fmt.Errorf("gather: %w", err)
	}
	for l := 0; l < layers; l++ {
		if err := r.GatherHost(firstLayer+l, dst+uintptr(int64(l)*layerStride), layerStride); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
	}
	return r.SyncCopies()
}

// failedPages counts (layer, page) pairs that a failed entry kept from being
// scattered.
func failedPages(pages []PageMap, entries []EntryResult, epl int) int {
	n := 0
	for l := 0; l*epl < len(entries); l++ {
		layer := entries[l*epl : (l+1)*epl]
		for _, p := range pages {
			for e := p.FirstEntry; e <= p.LastEntry; e++ {
				if layer[e].Status != EntryOK {
					n++
					break
				}
			}
		}
	}
	return n
}
