package harness

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvevents"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/sched"
)

// Tutti adapts the runtime package (tutti's store: prefix index, object map,
// slack-aware scheduler, one read per (layer, run)) to the harness. It keeps
// its own index and capacity (SelfIndexed); its capacity is set so that its
// index holds at least as many blocks as the shared Index of the other
// backends (runtime.CapacityForBlocks; the index share of the pool may admit
// a few more).
//
// Saves are waited for to completion inside Save (as for every backend), so
// the timeline charges their device time the same way; the runtime's
// deferral of writes into slack is therefore not credited here.
type Tutti struct {
	path    runtime.Path
	compute *Compute
	loadAll bool // tutti-cpu-load-all: the name of the planner-off variant
	env     Env
	store   *runtime.Store
	label   string
	// planned-recompute blocks: cached but left to recompute by the planner
	plannedRecompute int64
	// PathGPU: the engine's KV tensors in HBM, one per layer, shaped like
	// the harness's host KV memory (page ids are the same).
	devLayers []uint64
	// devVerify: restored pages are verified in HBM (DeviceVerifier),
	// decided at Open.
	devVerify bool
	// pinned: the host KV layers registered with CUDA while open (PathGPU).
	pinned []uintptr
	// saveBoundMs: runtime.Config.SaveBoundMs (0: the runtime's default).
	saveBoundMs int
	// runWidth: runtime.Config.RunWidth (0: the runtime's default).
	runWidth int
	// saveNote: where the saves' time went (Stats.Saves.CopyNs, ...) and
	// which I/Os went through a copy (Stats.Saves.StagedWrites,
	// Stats.Loads.StagedReads), set at Close.
	saveNote string
	// gpuWindow, gpuMaxIO, gpuLookahead: runtime.GPUConfig IOWindow,
	// MaxIOBytes, Lookahead (PathGPU only; 0: the runtime's default).
	gpuWindow, gpuMaxIO, gpuLookahead int
	// helper: the GPU ring helper's counters, read at Close.
	helperWakeups, helperBatchTimeouts int64
	sched                              sched.Stats // the store's scheduler, as of Close
	// devProbe: what Open measured to seed the device model (Stats.Devices.Probes), as of Close.
	devProbe string
	// kvEvents: runtime.Config.KVEvents; kvStats its counters, read at Close.
	kvEvents *kvevents.Config
	kvStats  *runtime.KVEventsStats
}

// SetKVEvents has the next Open publish the store's contents as KV events
// (runtime.Config.KVEvents).
func (t *Tutti) SetKVEvents(c *kvevents.Config) { t.kvEvents = c }

// KVEventsStats returns what the store published, as of Close (nil without
// SetKVEvents).
func (t *Tutti) KVEventsStats() *runtime.KVEventsStats { return t.kvStats }

// SchedStats returns the store's scheduler counters as of Close.
func (t *Tutti) SchedStats() sched.Stats { return t.sched }

// GPUHelper returns the GPU ring helper's kernel entries and the waits of
// them that ran the whole batch wait with reads in flight, as of Close
// (zero on PathCPU).
func (t *Tutti) GPUHelper() (wakeups, batchTimeouts int64) {
	return t.helperWakeups, t.helperBatchTimeouts
}

// SetGPUReads sizes the GPU path's reads for the next Open (tutti-gpu):
// runtime.GPUConfig IOWindow, MaxIOBytes and Lookahead; 0 keeps the
// runtime's default.
func (t *Tutti) SetGPUReads(window, maxIOBytes, lookahead int) {
	t.gpuWindow, t.gpuMaxIO, t.gpuLookahead = window, maxIOBytes, lookahead
}

// SetSaveBoundMs sets the store's save bound (runtime.Config.SaveBoundMs)
// for the next Open; 0 keeps the runtime's default (2 s). The scheduler
// cuts a save to what it can write within the bound, so with the default a
// 70B request that brings several GB of new KV keeps only its first blocks
// where the other backends keep all of them.
func (t *Tutti) SetSaveBoundMs(ms int) { t.saveBoundMs = ms }

// SetRunWidth sets the store's run width (runtime.Config.RunWidth) for the
// next Open: 1 puts each run on one device (the layout before objmap's
// manifest version 3), 0 keeps the runtime's default (every device).
func (t *Tutti) SetRunWidth(w int) { t.runWidth = w }

// NewTuttiCPU is tutti's CPU path (io_uring from Go into host KV memory).
// compute, when non-nil, is given to the scheduler so it loads only where
// loading beats recomputing.
func NewTuttiCPU(compute *Compute) *Tutti { return &Tutti{path: runtime.PathCPU, compute: compute} }

// NewTuttiCPULoadAll is tutti's CPU path with no compute model given to the
// scheduler, so it loads every cached block (tutti-cpu-load-all): the bound
// tutti-cpu's planner must not fall below, run side by side with it.
func NewTuttiCPULoadAll() *Tutti { return &Tutti{path: runtime.PathCPU, loadAll: true} }

// NewTuttiGPU is tutti's GPU path (GPU-driven io_uring, kernels package).
func NewTuttiGPU(compute *Compute) *Tutti { return &Tutti{path: runtime.PathGPU, compute: compute} }

func (t *Tutti) Name() string {
	switch {
	case t.path == runtime.PathGPU:
		return "tutti-gpu"
	case t.loadAll:
		return "tutti-cpu-load-all"
	}
	return "tutti-cpu"
}

func (t *Tutti) DirectIO() bool { return true }
func (t *Tutti) Label() string  { return t.label }

func (t *Tutti) Available() error {
	if t.path == runtime.PathGPU {
		if err := kernels.Init(0); err != nil {
			return fmt.Errorf("tutti-gpu: %v: %w", err, ErrUnavailable)
		}
	}
	return nil
}

func (t *Tutti) Open(env Env) error {
	t.env = env
	dirs := env.Dirs
	if len(dirs) == 0 {
		dirs = []string{env.Dir}
	}
	// striped over every dir; the runtime splits the capacity evenly
	cfg := runtime.Config{
		Dirs: dirs, CapacityBytes: runtime.CapacityForBlocksOn(env.Geometry, env.CapacityBlocks, len(dirs)),
		Geometry: env.Geometry, Layout: kvshape.LayoutPerLayer, NumPages: env.KV.NumPages,
		Path: t.path, QueueDepth: env.QueueDepth, SaveBoundMs: t.saveBoundMs, KVEvents: t.kvEvents, RunWidth: t.runWidth,
	}
	if t.runWidth == 1 { // each run in one file: a one-directory store's footprint
		cfg.CapacityBytes = runtime.CapacityForBlocksOn(env.Geometry, env.CapacityBlocks, 1)
	}
	if t.path == runtime.PathGPU {
		cfg.GPU.IOWindow, cfg.GPU.MaxIOBytes, cfg.GPU.Lookahead = t.gpuWindow, t.gpuMaxIO, t.gpuLookahead
	}
	if t.compute != nil {
		cfg.Compute = t.compute.Model()
	}
	s, err := runtime.Open(cfg)
	if err != nil {
		if errors.Is(err, runtime.ErrGPUUnavailable) {
			return fmt.Errorf("%s: %v: %w", t.Name(), err, ErrUnavailable)
		}
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	t.store = s
	regions := make([]runtime.Region, len(env.KV.Layers))
	for l, b := range env.KV.Layers {
		regions[l] = runtime.Region{Addr: b.Addr(), LenBytes: int64(b.Len())}
		if t.path == runtime.PathGPU {
			// The GPU path restores into HBM: a device tensor per layer,
			// mirrored to the host pages only to verify (HostSyncer).
			d, err := kernels.DevAllocOn(s.Config().GPU.Device, int64(b.Len()))
			if err != nil {
				return fmt.Errorf("%s: device KV layer %d: %w", t.Name(), l, err)
			}
			t.devLayers = append(t.devLayers, d)
			regions[l] = runtime.Region{Addr: uintptr(d), LenBytes: int64(b.Len())}
		}
	}
	if err := s.RegisterKV(runtime.KVMemory{Layers: regions}); err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	t.label = fmt.Sprintf("store capacity %d MiB on disk (runtime.CapacityForBlocksOn: its index holds at least the %d blocks the others hold); planner compute model: %v",
		cfg.CapacityBytes>>20, env.CapacityBlocks, t.compute != nil)
	if t.path == runtime.PathGPU {
		var how string
		t.devVerify, how = deviceVerify()
		t.label += "; " + t.pinHostKV() + "; " + how
	}
	return nil
}

// pinHostKV pins the harness's host KV memory (cudaHostRegister) while the
// GPU path is open, so the copies that mirror HBM pages to the host to
// verify them (ToHost, FromHost: outside every measured window) run at DMA
// speed instead of through the driver's pageable bounce. Where pinning
// fails the copies stay pageable, and the returned note says so.
func (t *Tutti) pinHostKV() string {
	for l, b := range t.env.KV.Layers {
		if err := kernels.HostRegister(b.Addr(), int64(b.Len())); err != nil {
			return fmt.Sprintf("host KV copies to and from HBM pageable (pinning layer %d: %v)", l, err)
		}
		t.pinned = append(t.pinned, b.Addr())
	}
	return "host KV pinned for the copies to and from HBM (outside the timed restores and saves)"
}

func (t *Tutti) Lookup(chain []uint64) int { return t.store.Lookup(chain) }

func (t *Tutti) Restore(req *Request) (RestoreResult, error) {
	g := t.env.Geometry
	before := t.store.Stats()
	res := RestoreResult{LayerReady: make([]time.Duration, g.Layers)}
	start := time.Now()
	l, err := t.store.Load(req.Chain, req.Pages)
	if err != nil {
		return res, fmt.Errorf("tutti: load: %w", err)
	}
	for layer := 0; layer < g.Layers; layer++ {
		if err := l.WaitLayer(layer); err != nil {
			return res, fmt.Errorf("tutti: waiting for layer %d: %w", layer, err)
		}
		res.LayerReady[layer] = time.Since(start)
	}
	if err := l.Wait(); err != nil {
		return res, fmt.Errorf("tutti: load: %w", err)
	}
	after := t.store.Stats()
	res.Blocks = l.Blocks()
	res.Bytes = after.Loads.RestoredBytes - before.Loads.RestoredBytes
	res.ReadBytes = res.Bytes + after.Loads.OverreadBytes - before.Loads.OverreadBytes
	res.ReadBytesPerDir = t.perDir(before.Devices, after.Devices)
	res.IOs = after.Loads.ReadIOs - before.Loads.ReadIOs
	res.Runs = int((res.IOs - (after.Loads.SplitIOs - before.Loads.SplitIOs)) / int64(g.Layers))
	for i := range after.Loads.MissBlocks {
		res.Fallbacks += int(after.Loads.MissBlocks[i] - before.Loads.MissBlocks[i])
	}
	t.plannedRecompute += int64(l.Cached() - l.Planned())
	return res, nil
}

// perDir is the bytes the store read from each of Env.Dirs between two
// Stats (the store orders its directories its own way: matched by path).
func (t *Tutti) perDir(before, after runtime.DeviceStats) []int64 {
	dirs := t.env.Dirs
	if len(dirs) == 0 {
		dirs = []string{t.env.Dir}
	}
	out := make([]int64, len(dirs))
	for i, d := range after.Dirs {
		for j, e := range dirs {
			if filepath.Clean(e) == filepath.Clean(d) && i < len(before.ReadBytes) {
				out[j] += after.ReadBytes[i] - before.ReadBytes[i]
			}
		}
	}
	return out
}

func (t *Tutti) Save(req *Request) (SaveResult, error) {
	before := t.store.Stats()
	sv, err := t.store.Save(req.Chain, req.Pages)
	if err != nil {
		return SaveResult{}, fmt.Errorf("tutti: save: %w", err)
	}
	sv.Wait()
	after := t.store.Stats()
	res := SaveResult{Blocks: sv.Saved(), Bytes: after.Saves.SavedBytes - before.Saves.SavedBytes, IOs: after.Saves.WriteIOs - before.Saves.WriteIOs}
	// Write errors and the scheduler's cuts (the save budget, what the
	// device cannot write within the save bound) are fallbacks; no room is
	// the capacity its own index manages, as evictions are for the others.
	for _, c := range []runtime.SkipCause{runtime.SkipENOSPC, runtime.SkipIOError, runtime.SkipClosed, runtime.SkipBudget, runtime.SkipBound} {
		res.Fallbacks += sv.Skipped(c)
	}
	return res, nil
}

func (t *Tutti) Evict([]uint64) error { return nil } // its own index evicts

// DeviceProbe says what the store's Open measured to seed its device model
// (runtime Stats.Devices) and how often its reads were re-probed, as of
// Close; the planner's load-or-recompute choices start from it.
func (t *Tutti) DeviceProbe() string { return t.devProbe }

// PlannedRecomputeBlocks counts cached blocks the planner chose to recompute.
func (t *Tutti) PlannedRecomputeBlocks() int64 { return t.plannedRecompute }

func (t *Tutti) Close() error {
	var errs []error
	if t.store != nil {
		st := t.store.Stats()
		t.helperWakeups, t.helperBatchTimeouts = st.GPU.HelperWakeups, st.GPU.HelperBatchTimeouts
		t.sched = st.Sched
		probes := make([]string, len(st.Devices.Probes))
		for i, p := range st.Devices.Probes {
			probes[i] = fmt.Sprintf("dir %d: %v", i, p)
		}
		t.devProbe = strings.Join(probes, "; ")
		if st.Saves.WriteIOs > 0 {
			t.saveNote = fmt.Sprintf("%d save writes (%.1f GiB); getting their bytes into staging took %.2f s and checksumming them %.2f s, summed over the stage workers",
				st.Saves.WriteIOs, float64(st.Saves.SavedBytes)/(1<<30), float64(st.Saves.CopyNs)/1e9, float64(st.Saves.ChecksumNs)/1e9)
			if st.Saves.DirectWrites+st.Saves.StagedWrites > 0 {
				t.saveNote += fmt.Sprintf("; %d written from the engine's pages, %d staged through a copy", st.Saves.DirectWrites, st.Saves.StagedWrites)
				if st.Saves.StagedReason != "" {
					t.saveNote += " (" + st.Saves.StagedReason + ")"
				}
			}
		}
		if st.Loads.DirectReads+st.Loads.StagedReads > 0 {
			if t.saveNote != "" {
				t.saveNote += "; "
			}
			t.saveNote += fmt.Sprintf("%d load reads into the engine's pages, %d staged through a copy", st.Loads.DirectReads, st.Loads.StagedReads)
			if st.Loads.StagedReason != "" {
				t.saveNote += " (" + st.Loads.StagedReason + ")"
			}
		}
		if n := st.Devices.Reprobes + st.Devices.ReprobeFailures + st.Devices.ReprobeSkips; n > 0 {
			t.devProbe += fmt.Sprintf("; reads re-probed %d times, %d failed, %d runs too short", st.Devices.Reprobes, st.Devices.ReprobeFailures, st.Devices.ReprobeSkips)
			if st.Devices.ReprobeError != "" {
				t.devProbe += " (last failure: " + st.Devices.ReprobeError + ")"
			}
		}
		if t.kvEvents != nil {
			// Published while open: the counters before Close's final flush.
			if ks := st.Events; ks.Enabled {
				t.kvStats = &ks
			}
		}
		errs = append(errs, t.store.Close())
		t.store = nil
	}
	for _, d := range t.devLayers {
		errs = append(errs, kernels.DevFree(d))
	}
	t.devLayers = nil
	for _, a := range t.pinned {
		errs = append(errs, kernels.HostUnregister(a))
	}
	t.pinned = nil
	return errors.Join(errs...)
}

// pageRuns calls fn for each run of consecutive page ids in pages (the
// harness's allocator hands out mostly consecutive ids), so copies between
// host and device are few and large.
func pageRuns(pages []int32, fn func(first int32, n int) error) error {
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j] == pages[j-1]+1 {
			j++
		}
		if err := fn(pages[i], j-i); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// copyPages copies pages between the host KV memory and the device tensors,
// every layer and plane (per-layer layout: a plane's pages are contiguous).
func (t *Tutti) copyPages(pages []int32, toHost bool) error {
	g := t.env.Geometry
	pb := g.PageBytesPerPlane()
	for l, dev := range t.devLayers {
		host := t.env.KV.Layers[l].Addr()
		for p := 0; p < g.Planes; p++ {
			err := pageRuns(pages, func(first int32, n int) error {
				off, err := g.PageOffset(kvshape.LayoutPerLayer, t.env.KV.NumPages, l, p, int(first))
				if err != nil {
					return err
				}
				if toHost {
					return kernels.CopyToHost(host+uintptr(off), dev+uint64(off), int64(n)*pb)
				}
				return kernels.CopyToDevice(dev+uint64(off), host+uintptr(off), int64(n)*pb)
			})
			if err != nil {
				return fmt.Errorf("%s: copying layer %d plane %d: %w", t.Name(), l, p, err)
			}
		}
	}
	return nil
}

// OwnMemory implements HostSyncer: on the GPU path restores land in HBM.
func (t *Tutti) OwnMemory() bool { return t.devLayers != nil }

// Invalidate implements HostSyncer: the hit pages in HBM are zeroed on the
// device (cudaMemset per run of pages, layer and plane: no copy over PCIe).
func (t *Tutti) Invalidate(req *Request) error {
	if t.devLayers == nil {
		return nil
	}
	g := t.env.Geometry
	pb := g.PageBytesPerPlane()
	for l, dev := range t.devLayers {
		for p := 0; p < g.Planes; p++ {
			err := pageRuns(req.Pages[:req.Hit*g.ChunkPages], func(first int32, n int) error {
				off, err := g.PageOffset(kvshape.LayoutPerLayer, t.env.KV.NumPages, l, p, int(first))
				if err != nil {
					return err
				}
				return kernels.MemsetDevice(dev+uint64(off), 0, int64(n)*pb)
			})
			if err != nil {
				return fmt.Errorf("%s: clearing layer %d plane %d: %w", t.Name(), l, p, err)
			}
		}
	}
	return nil
}

// ToHost implements HostSyncer: on the GPU path, the restored blocks' pages
// are copied from HBM into the host pages the harness verifies.
func (t *Tutti) ToHost(req *Request, blocks int) error {
	if t.devLayers == nil {
		return nil
	}
	return t.copyPages(req.Pages[:blocks*t.env.Geometry.ChunkPages], true)
}

// FromHost implements HostSyncer: on the GPU path, the pages of the blocks to
// save (filled by the harness as a prefill would) are copied into HBM, where
// the runtime gathers them from.
func (t *Tutti) FromHost(req *Request) error {
	if t.devLayers == nil {
		return nil
	}
	cp := t.env.Geometry.ChunkPages
	return t.copyPages(req.Pages[req.Hit*cp:req.SaveEnd*cp], false)
}
