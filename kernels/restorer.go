package kernels

/*
#include <stdlib.h>
#include "tutti_kernels.h"
tk_status tkl_bind(const tk_bind_params *p, uint64_t *c);
tk_status tkl_unbind(uint64_t c);
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/uring"
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
	if cfg.GatherLanes == 0 {
		cfg.GatherLanes = C.TK_GATHER_LANES // the library's default, named once (tutti_kernels.h)
	}
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
	if cfg.GatherLanes < 1 || cfg.GatherLanes > C.TK_MAX_GATHER_LANES {
		return nil, fmt.Errorf("binding kernels: %d gather lanes (want 1..%d): %w", cfg.GatherLanes, C.TK_MAX_GATHER_LANES, ErrInvalid)
	}
	if err := cfg.checkFeed(); err != nil {
		return nil, fmt.Errorf("binding kernels: %w", err)
	}
	lim := PlanLimits(cfg)
	slotBytes := lim.SlotBytes
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
	p.gather_lanes = C.uint32_t(cfg.GatherLanes)
	if opts.ZeroCopyScatter {
		p.zero_copy_scatter = 1
	}
	if opts.ZeroCopyGather {
		p.zero_copy_gather = 1
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
func stagingSlotBytes(cfg Config, g kvshape.Geometry) int64 {
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
