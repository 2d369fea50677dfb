package runtime

// PathGPU: package kernels restores. The GPU drives its own SQPOLL io_uring
// (one read per (layer, extent), in the kernels' staging), scatters into the
// engine's KV tensors in HBM and marks layers ready with CUDA events. Saves
// gather pages from HBM into this store's (CUDA-registered) staging slots,
// the GPU checksumming every page plane as it gathers, and write them from
// the CPU through the same save path as PathCPU.

import (
	"errors"
	"fmt"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/sched"
	"github.com/tutti-io/tutti/uring"
)

// ErrGPUUnavailable is wrapped by Open with PathGPU when the GPU path cannot
// run here; the kernels' cause (kernels.ErrNoGPU, kernels.ErrNotLoaded, ...)
// is wrapped too. Open never falls back to PathCPU by itself.
var ErrGPUUnavailable = errors.New("runtime: GPU path unavailable")

// ErrNotGPU is returned by GPU-only calls (Load.StreamWaitLayer) on PathCPU.
var ErrNotGPU = errors.New("runtime: not on the GPU path")

// gpuAvailable initialises the kernels on device, or says why it cannot.
func gpuAvailable(device int) error {
	if err := kernels.Init(device); err != nil {
		return fmt.Errorf("%w: %w", ErrGPUUnavailable, err)
	}
	return nil
}

// gpuPath is the bound GPU context of a store.
type gpuPath struct {
	r     gpuRestorer
	ring  *uring.Ring // nil with Config.gpuBind
	lanes chan int    // the restorer's free gather lanes: a stage worker holds one per gather
	// planeShift combines the GPU's plane CRCs of a save's gathers into
	// chunk CRCs (the plane length's objmap.CRCShift).
	planeShift *objmap.CRCShift
	slots      []uintptr // staging slots registered with CUDA
	// kickFallback: why the kick-mode ring has no DEFER_TASKRUN (empty: it
	// has, or the ring is SQPOLL), reported in Stats.
	kickFallback string
}

// bindGPU binds the engine's device KV tensors, a ring dedicated to the GPU
// and the store's staging slots (for save gathers).
func (s *Store) bindGPU(kv KVMemory) (*gpuPath, error) {
	if err := checkKV(s.geo, s.cfg.Layout, s.cfg.NumPages, kv); err != nil {
		return nil, err
	}
	if s.cfg.gpuBind != nil {
		r, err := s.cfg.gpuBind(s.cfg, kv)
		if err != nil {
			return nil, fmt.Errorf("runtime: binding the GPU: %w", err)
		}
		return newGPUPath(r, s.geo)
	}
	var ptrs []uint64
	if s.cfg.Layout == kvshape.LayoutPerLayer {
		for _, r := range kv.Layers {
			ptrs = append(ptrs, uint64(r.Addr))
		}
	} else {
		ptrs = []uint64{uint64(kv.Cross.Addr)}
	}
	rc := uring.DefaultConfig()
	// The queue holds the window (uring.New rounds it up to a power of two).
	rc.Entries = uint32(max(64, s.cfg.QueueDepth, s.cfg.GPU.IOWindow))
	// Without SQPOLL the kernels' helper thread submits and runs the
	// completions' task work (kick mode), on a DEFER_TASKRUN ring where the
	// kernel allows it; nothing else enters this ring.
	var ring *uring.Ring
	var err error
	var fallback string
	if s.cfg.GPU.SQPoll {
		rc.SQPoll = true
		rc.SQThreadIdleMs = 20
		ring, err = uring.New(rc)
	} else {
		ring, fallback, err = kernels.NewKickRing(rc)
	}
	if err != nil {
		return nil, fmt.Errorf("runtime: GPU ring: %w", err)
	}
	r, err := kernels.Bind(kernelsConfig(s.cfg, ptrs, ring))
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("runtime: binding the GPU: %w", err)
	}
	gp, err := newGPUPath(kernelsRestorer{r}, s.geo)
	if err != nil {
		ring.Close()
		return nil, err
	}
	gp.ring, gp.kickFallback = ring, fallback
	for _, sl := range s.staging.all {
		if err := kernels.HostRegister(sl.buf.Addr(), int64(sl.buf.Len())); err != nil {
			gp.close()
			return nil, fmt.Errorf("runtime: registering staging with CUDA: %w", err)
		}
		gp.slots = append(gp.slots, sl.buf.Addr())
	}
	return gp, nil
}

// kernelsConfig is what the store binds the kernels with (cfg has its
// defaults): KV tensors ptrs, ring ring.
func kernelsConfig(cfg Config, ptrs []uint64, ring *uring.Ring) kernels.Config {
	return kernels.Config{Device: cfg.GPU.Device, Geometry: cfg.Geometry, Layout: cfg.Layout,
		NumPages: cfg.NumPages, KV: ptrs, Ring: ring, MaxPages: cfg.GPU.MaxPages, MaxExtents: cfg.gpuMaxExtents(),
		IOWindow: cfg.GPU.IOWindow, MaxIOBytes: cfg.GPU.MaxIOBytes, Lookahead: cfg.GPU.Lookahead}
}

// newGPUPath is the path of bound restorer r with all its gather lanes
// free. On an error it closes r.
func newGPUPath(r gpuRestorer, g kvshape.Geometry) (*gpuPath, error) {
	n := r.GatherLanes()
	if n < 1 {
		r.Close()
		return nil, fmt.Errorf("runtime: binding the GPU: the restorer has %d gather lanes", n)
	}
	gp := &gpuPath{r: r, lanes: make(chan int, n), planeShift: objmap.NewCRCShift(g.PageBytesPerPlane())}
	for i := range n {
		gp.lanes <- i
	}
	return gp, nil
}

func (gp *gpuPath) close() error {
	var errs []error
	for _, a := range gp.slots {
		errs = append(errs, kernels.HostUnregister(a))
	}
	errs = append(errs, gp.r.Close())
	if gp.ring != nil {
		errs = append(errs, gp.ring.Close())
	}
	return errors.Join(errs...)
}

// gather copies pages [first, first+n) of the run's page list, layer layer,
// from HBM into dst (a registered staging slot) in object layout, and the
// CRC32C of each of their planes into planeCRCs (len(pages)*Planes), on a
// free gather lane: the stage workers' gathers run at once, up to the lanes
// (one lock over them all serialized every save behind every other).
func (gp *gpuPath) gather(pages []int32, layer int, dst uintptr, bytes int64, planeCRCs []uint32) error {
	lane := <-gp.lanes
	defer func() { gp.lanes <- lane }()
	return gp.r.GatherLane(lane, pages, layer, 1, dst, bytes, planeCRCs)
}

// gpuWriteUnit is the size GPU save writes are cut at: whole pages (Gather
// copies pages) and whole O_DIRECT blocks.
func gpuWriteUnit(g kvshape.Geometry) int64 {
	return lcm(g.PageBytesPerLayer(), objmap.BlockBytes)
}

// gpuCut trims runs to what one GPU restore can take (GPU.MaxRuns extents,
// GPU.MaxPages pages, extents starting on an O_DIRECT boundary) and returns
// the blocks kept; the rest is recomputed like blocks the plan left out.
func (s *Store) gpuCut(runs []loadRun, planned int) int {
	g := s.geo
	kept, pages := 0, 0
	for i, r := range runs {
		if kept >= planned || i >= s.cfg.GPU.MaxRuns || (int64(r.first)*g.ChunkBytesPerLayer())%objmap.BlockBytes != 0 {
			break
		}
		k := min(r.k, planned-kept, (s.cfg.GPU.MaxPages-pages)/g.ChunkPages)
		if k <= 0 {
			break
		}
		kept += k
		pages += k * g.ChunkPages
	}
	return kept
}

// startGPU builds the load's GPU request and submits it once the scheduler
// dispatched it (sched.LoadRequest.Whole): at once when planLoad's round
// dispatched it, else from the load's goroutine when saves near their bound
// held it. A goroutine then waits for the GPU layer by layer.
func (l *Load) startGPU() {
	req := l.gpuRequest()
	select {
	case io := <-l.ios:
		l.submitGPU(io, req)
		go l.driveGPU()
	default:
		go func() {
			l.submitGPU(<-l.ios, req)
			l.driveGPU()
		}()
	}
}

// gpuRequest is the kernels request of the load's runs, cut into pieces
// ordered over the devices (gpuPieces): extent i of every layer is piece i,
// l.gpuPieces[i] (driveGPU maps failed entries back to runs by it).
func (l *Load) gpuRequest() kernels.Request {
	s := l.s
	g := s.geo
	l.gpuPieces = gpuPieces(l.runs, g, s.cfg.GPU.IOWindow, s.cfg.GPU.MaxIOBytes, s.cfg.gpuMaxExtents())
	req := kernels.Request{Layers: make([][]kernels.Extent, g.Layers)}
	for _, p := range l.gpuPieces {
		base := (l.runs[p.run].chainPos + p.first) * g.ChunkPages
		req.Pages = append(req.Pages, l.pages[base:base+p.k*g.ChunkPages]...)
	}
	for layer := range req.Layers {
		req.Layers[layer] = make([]kernels.Extent, 0, len(l.gpuPieces))
		for _, p := range l.gpuPieces {
			r := l.runs[p.run]
			off, _ := objmap.ObjectOffset(g, r.run.Chunks, layer)
			req.Layers[layer] = append(req.Layers[layer], kernels.Extent{FD: r.run.File.FD, Align: r.run.File.DirectAlign,
				Offset: r.run.Offset + off + int64(r.first+p.first)*g.ChunkBytesPerLayer(), Pages: p.k * g.ChunkPages})
		}
	}
	return req
}

// submitGPU puts the dispatched restore io on the GPU. A refusal fails the
// whole load (MissGPU); driveGPU still retires io.
func (l *Load) submitGPU(io sched.IO, req kernels.Request) {
	l.gpuIO = io
	l.firstNs = l.s.sched.NowNs()
	x, err := l.s.gpu.r.Restore(req)
	if err != nil {
		l.failRuns(0, MissGPU, err)
	}
	l.mu.Lock()
	if err != nil {
		l.gpuErr, l.gpuEnded = err, true
	} else {
		l.gpuX = x
		l.ioCount = int64(l.s.geo.Layers * len(l.runs))
	}
	l.mu.Unlock()
	l.cond.Broadcast()
}

// observeGPUReads reports a finished GPU restore's reads to each device's
// model: each piece's bytes to the device that holds its run, the reads
// counted as kernels cuts them (MaxIOBytes), busy from submission to the last layer.
func (l *Load) observeGPUReads() {
	s := l.s
	g := s.geo
	now := s.sched.NowNs()
	l.mu.Lock()
	valid := l.validRuns
	l.mu.Unlock()
	var bs []ioBatch
	for _, p := range l.gpuPieces {
		if p.run >= valid {
			continue
		}
		perLayer := (int64(p.k)*g.ChunkBytesPerLayer() + objmap.BlockBytes - 1) &^ (objmap.BlockBytes - 1)
		reads := (perLayer + int64(s.cfg.GPU.MaxIOBytes) - 1) / int64(s.cfg.GPU.MaxIOBytes)
		b := batchOf(&bs, l.runs[p.run].run.Device)
		b.bytes += perLayer * int64(g.Layers)
		b.ops += reads * int64(g.Layers)
	}
	for dev, b := range bs {
		if b.ops > 0 {
			s.sched.ObserveReads(dev, b.bytes, int(b.ops), now-l.firstNs)
		}
	}
}

// driveGPU waits for the submitted restore layer by layer: each layer the
// GPU finished is ready for WaitLayer and retired in the scheduler (its
// reads leave their devices' pending work, so saves queued behind them may
// go), failed entries are mapped to runs, the reads are reported to the
// device models, and the restore is released and retired.
func (l *Load) driveGPU() {
	l.mu.Lock()
	x := l.gpuX
	l.mu.Unlock()
	if x != nil {
		l.waitGPU(x)
	}
	l.s.sched.Complete(l.gpuIO, true)
	l.mu.Lock()
	l.err = l.gpuErr
	l.mu.Unlock()
	l.finish()
}

func (l *Load) waitGPU(x gpuRestore) {
	g := l.s.geo
	for layer := 0; layer < g.Layers; layer++ {
		// ErrIO here is a failed entry: mapped to runs after Wait.
		if err := x.WaitLayer(layer); err != nil && !errors.Is(err, kernels.ErrIO) && l.gpuErr == nil {
			l.gpuErr = err
		}
		l.mu.Lock()
		l.ready = layer + 1
		l.mu.Unlock()
		l.cond.Broadcast()
		l.s.sched.CompleteLayers(l.gpuIO, layer+1)
	}
	res, err := x.Wait()
	if res != nil {
		for _, f := range res.Failed {
			// Extent i of every layer is piece i (gpuRequest); one out
			// of range fails the whole load.
			r := 0
			if f.Extent >= 0 && f.Extent < len(l.gpuPieces) {
				r = l.gpuPieces[f.Extent].run
			}
			l.failRuns(r, MissIOError, f)
		}
	}
	l.observeGPUReads()
	if err != nil && (res == nil || len(res.Failed) == 0) {
		l.failRuns(0, MissGPU, err)
		if l.gpuErr == nil {
			l.gpuErr = err
		}
	}
	rerr := x.Release()
	l.mu.Lock()
	if rerr != nil && l.gpuErr == nil {
		l.gpuErr = fmt.Errorf("runtime: releasing the GPU restore: %w", rerr)
	}
	l.gpuX, l.gpuEnded = nil, true
	l.mu.Unlock()
}

// StreamWaitLayer makes a CUDA stream wait until layer is in the KV tensors,
// with no host round trip (PathGPU only; ErrNotGPU otherwise). A failed
// entry leaves its pages unwritten; Blocks after Wait says how far the load
// really got. For a layer far ahead it first blocks the host until the
// layer is on the GPU's streams (kernels enqueues layer l once layer
// l-EnqueueLayers, 16 to 48 layers back, is scattered), so call it layer by
// layer, as the engine computes. A restore the scheduler still holds back
// (queued saves would otherwise miss their bound) blocks the host until it
// is on the GPU.
func (l *Load) StreamWaitLayer(layer int, stream uintptr) error {
	if l.s.gpu == nil {
		return ErrNotGPU
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// A restore the scheduler has not dispatched yet (saves near their
	// bound hold it) is not on the GPU's streams: wait for its submission,
	// or a stream would not wait at all.
	for l.gpuX == nil && !l.gpuEnded && !l.finished && l.planned > 0 {
		l.cond.Wait()
	}
	if l.gpuX == nil || l.finished {
		return nil // nothing in flight: the layer is as done as it gets
	}
	return l.gpuX.StreamWaitLayer(layer, stream)
}

// gpuPath is the bound GPU path, or nil before RegisterKV and on PathCPU.
// s.gpu is written once, before kvSet is stored.
func (s *Store) gpuPath() *gpuPath {
	if !s.kvSet.Load() {
		return nil
	}
	return s.gpu
}
