package harness

import (
	"errors"
	"fmt"
	"time"

	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/objmap"
	"github.com/tutti-io/tutti/runtime"
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
	env     Env
	store   *runtime.Store
	label   string
	// planned-recompute blocks: cached but left to recompute by the planner
	plannedRecompute int64
}

// NewTuttiCPU is tutti's CPU path (io_uring from Go into host KV memory).
// compute, when non-nil, is given to the scheduler so it loads only where
// loading beats recomputing.
func NewTuttiCPU(compute *Compute) *Tutti { return &Tutti{path: runtime.PathCPU, compute: compute} }

// NewTuttiGPU is tutti's GPU path (GPU-driven io_uring, kernels package).
func NewTuttiGPU(compute *Compute) *Tutti { return &Tutti{path: runtime.PathGPU, compute: compute} }

func (t *Tutti) Name() string {
	if t.path == runtime.PathGPU {
		return "tutti-gpu"
	}
	return "tutti-cpu"
}

func (t *Tutti) DirectIO() bool { return true }
func (t *Tutti) Label() string  { return t.label }

func (t *Tutti) Available() error {
	if t.path == runtime.PathGPU {
		if err := kernels.Load(); err != nil {
			return fmt.Errorf("tutti-gpu: kernels library: %v: %w", err, ErrUnavailable)
		}
		// The replay keeps KV memory in host memory; the GPU path restores
		// into device memory, which this harness does not allocate yet.
		return fmt.Errorf("tutti-gpu: the replay's device KV memory is not wired yet (runtime PathGPU): %w", ErrUnavailable)
	}
	return nil
}

func (t *Tutti) Open(env Env) error {
	t.env = env
	cfg := runtime.Config{
		Dirs: []string{env.Dir}, CapacityBytes: runtime.CapacityForBlocks(env.Geometry, env.CapacityBlocks),
		Geometry: env.Geometry, Layout: objmap.LayoutPerLayer, NumPages: env.KV.NumPages,
		Path: t.path, QueueDepth: env.QueueDepth,
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
	}
	if err := s.RegisterKV(runtime.KVMemory{Layers: regions}); err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	t.label = fmt.Sprintf("store capacity %d MiB on disk (runtime.CapacityForBlocks: its index holds at least the %d blocks the others hold); planner compute model: %v",
		cfg.CapacityBytes>>20, env.CapacityBlocks, t.compute != nil)
	return nil
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
	res.Bytes = after.RestoredBytes - before.RestoredBytes
	res.ReadBytes = res.Bytes + after.OverreadBytes - before.OverreadBytes
	res.IOs = after.ReadIOs - before.ReadIOs
	res.Runs = int((res.IOs - (after.SplitIOs - before.SplitIOs)) / int64(g.Layers))
	for i := range after.MissBlocks {
		res.Fallbacks += int(after.MissBlocks[i] - before.MissBlocks[i])
	}
	t.plannedRecompute += int64(l.Cached() - l.Planned())
	return res, nil
}

func (t *Tutti) Save(req *Request) (SaveResult, error) {
	before := t.store.Stats()
	sv, err := t.store.Save(req.Chain, req.Pages)
	if err != nil {
		return SaveResult{}, fmt.Errorf("tutti: save: %w", err)
	}
	sv.Wait()
	after := t.store.Stats()
	res := SaveResult{Blocks: sv.Saved(), Bytes: after.SavedBytes - before.SavedBytes, IOs: after.WriteIOs - before.WriteIOs}
	for _, c := range []runtime.SkipCause{runtime.SkipENOSPC, runtime.SkipIOError, runtime.SkipClosed} {
		res.Fallbacks += sv.Skipped(c)
	}
	return res, nil
}

func (t *Tutti) Evict([]uint64) error { return nil } // its own index evicts

// PlannedRecomputeBlocks counts cached blocks the planner chose to recompute.
func (t *Tutti) PlannedRecomputeBlocks() int64 { return t.plannedRecompute }

func (t *Tutti) Close() error {
	if t.store == nil {
		return nil
	}
	err := t.store.Close()
	t.store = nil
	return err
}
