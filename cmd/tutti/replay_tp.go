package main

// tutti replay --gpus N: tutti's CPU path over a tensor-parallel group
// (runtime/tp), as a harness backend. Kept apart from replay.go, which only
// swaps it in for tutti-cpu.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tutti-io/tutti/eval/harness"
	"github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/runtime/tp"
)

// tpBackend replays tutti-cpu over N ranks. The harness's engine KV memory
// stands for the union of the ranks' memories: each rank has its own store
// (Dir/rank<r>) and its own shard KV memory (tp.ShardGeometry). Save first
// splits the request's pages into the ranks' shards, then every rank saves
// at once; Restore loads on every rank at once (layer l is ready when every
// rank has it), then joins the shards back into the engine memory for the
// harness's bit-for-bit check. The split and join are copies a TP engine
// never makes (its ranks hold only their shards): the join happens after the
// last layer's readiness is taken, the split is inside the timed save.
type tpBackend struct {
	ranks   int
	compute *harness.Compute
	env     harness.Env
	shard   kvshape.Geometry
	grp     *tp.Group
	kv      []*runtime.HostKV
	label   string
}

func newTPBackend(ranks int, compute *harness.Compute) *tpBackend {
	return &tpBackend{ranks: ranks, compute: compute}
}

func (t *tpBackend) Name() string     { return fmt.Sprintf("tutti-cpu-tp%d", t.ranks) }
func (t *tpBackend) DirectIO() bool   { return true }
func (t *tpBackend) Label() string    { return t.label }
func (t *tpBackend) Available() error { return nil }

func (t *tpBackend) Open(env harness.Env) error {
	t.env = env
	shard, err := tp.ShardGeometry(env.Geometry, t.ranks)
	if err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	t.shard = shard
	roots := env.Dirs
	if len(roots) == 0 {
		roots = []string{env.Dir}
	}
	cfg := tp.Config{Ranks: t.ranks, Store: runtime.Config{
		CapacityBytes: runtime.CapacityForBlocksOn(shard, env.CapacityBlocks, len(roots)),
		Geometry:      env.Geometry, Layout: kvshape.LayoutPerLayer, NumPages: env.KV.NumPages,
		Path: runtime.PathCPU, QueueDepth: env.QueueDepth,
	}}
	if t.compute != nil {
		cfg.Store.Compute = t.compute.Model()
	}
	for r := 0; r < t.ranks; r++ {
		// each rank's store stripes over every dir of the replay
		var dirs []string
		for _, root := range roots {
			d := filepath.Join(root, fmt.Sprintf("rank%d", r))
			if err := os.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("%s: %w", t.Name(), err)
			}
			dirs = append(dirs, d)
		}
		cfg.Dirs = append(cfg.Dirs, dirs)
	}
	if t.grp, err = tp.Open(cfg); err != nil {
		return fmt.Errorf("%s: %w", t.Name(), err)
	}
	for r := 0; r < t.ranks; r++ {
		kv, err := runtime.AllocHostKV(shard, kvshape.LayoutPerLayer, env.KV.NumPages)
		if err != nil {
			return fmt.Errorf("%s: rank %d: %w", t.Name(), r, err)
		}
		t.kv = append(t.kv, kv)
		if err := t.grp.RegisterKV(r, kv.Memory()); err != nil {
			return fmt.Errorf("%s: %w", t.Name(), err)
		}
	}
	what := fmt.Sprintf("KV heads split %d ways", t.ranks)
	if tp.Replicated(env.Geometry) {
		what = fmt.Sprintf("latent cache replicated on %d ranks", t.ranks)
	}
	t.label = fmt.Sprintf("%d tensor-parallel ranks on the CPU path (%s), each its own store of %d MiB; a block is a hit only when every rank committed it; save time includes splitting the engine's pages into shards; planner compute model: %v",
		t.ranks, what, cfg.Store.CapacityBytes>>20, t.compute != nil)
	return nil
}

func (t *tpBackend) Lookup(chain []uint64) int { return t.grp.Lookup(chain) }

// shards copies the first blocks of the request between the engine memory
// and the ranks' shards (toShard), or back; a replicated page is taken from
// rank 0 and every other rank's copy must equal it.
func (t *tpBackend) shards(req *harness.Request, blocks int, toShard bool) error {
	g := t.env.Geometry
	for _, page := range req.Pages[:blocks*g.ChunkPages] {
		for l := 0; l < g.Layers; l++ {
			for pl := 0; pl < g.Planes; pl++ {
				full := t.env.KV.Page(l, pl, page)
				for r, kv := range t.kv {
					sh := kv.Page(l, pl, page)
					if !toShard && tp.Replicated(g) && r > 0 {
						if !bytes.Equal(sh, t.kv[0].Page(l, pl, page)) {
							return fmt.Errorf("rank %d's replica of page %d layer %d differs from rank 0's", r, page, l)
						}
						continue
					}
					if err := tp.CopyShard(g, t.ranks, r, full, sh, toShard); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

func (t *tpBackend) Restore(req *harness.Request) (harness.RestoreResult, error) {
	g := t.env.Geometry
	before := t.grp.Stats()
	res := harness.RestoreResult{LayerReady: make([]time.Duration, g.Layers)}
	start := time.Now()
	l, err := t.grp.Load(req.Chain, req.Pages)
	if err != nil {
		return res, fmt.Errorf("%s: load: %w", t.Name(), err)
	}
	for layer := 0; layer < g.Layers; layer++ {
		if err := l.WaitLayer(layer); err != nil {
			return res, fmt.Errorf("%s: waiting for layer %d: %w", t.Name(), layer, err)
		}
		res.LayerReady[layer] = time.Since(start)
	}
	if err := l.Wait(); err != nil {
		return res, fmt.Errorf("%s: load: %w", t.Name(), err)
	}
	res.Blocks = l.Blocks()
	if err := t.shards(req, res.Blocks, false); err != nil {
		return res, fmt.Errorf("%s: %w", t.Name(), err)
	}
	after := t.grp.Stats()
	// The group's blocks, in every rank's KV memory; reads and I/Os are
	// every rank's (a rank may read blocks past the group's hit).
	res.Bytes = int64(res.Blocks) * t.shard.ChunkBytes() * int64(t.ranks)
	var splits int64
	for r := range after.Rank {
		a, b := after.Rank[r], before.Rank[r]
		res.ReadBytes += a.Loads.RestoredBytes - b.Loads.RestoredBytes + a.Loads.OverreadBytes - b.Loads.OverreadBytes
		res.IOs += a.Loads.ReadIOs - b.Loads.ReadIOs
		splits += a.Loads.SplitIOs - b.Loads.SplitIOs
	}
	res.Runs = int((res.IOs - splits) / int64(g.Layers))
	res.Fallbacks = l.Planned() - l.Blocks()
	return res, nil
}

func (t *tpBackend) Save(req *harness.Request) (harness.SaveResult, error) {
	if err := t.shards(req, len(req.Chain), true); err != nil {
		return harness.SaveResult{}, fmt.Errorf("%s: %w", t.Name(), err)
	}
	before := t.grp.Stats()
	sv, err := t.grp.Save(req.Chain, req.Pages)
	if err != nil {
		return harness.SaveResult{}, fmt.Errorf("%s: save: %w", t.Name(), err)
	}
	sv.Wait()
	after := t.grp.Stats()
	res := harness.SaveResult{Blocks: sv.Saved()}
	for r := range after.Rank {
		res.Bytes += after.Rank[r].Saves.SavedBytes - before.Rank[r].Saves.SavedBytes
		res.IOs += after.Rank[r].Saves.WriteIOs - before.Rank[r].Saves.WriteIOs
	}
	if sv.Failed() != nil {
		// Blocks some rank could not store are stored on none: counted.
		res.Fallbacks = max(0, min(req.SaveEnd, len(req.Chain))-sv.Resident())
	}
	return res, nil
}

func (t *tpBackend) Evict([]uint64) error { return nil } // every rank's index evicts

func (t *tpBackend) Close() error {
	var errs []error
	if t.grp != nil {
		errs = append(errs, t.grp.Close())
		t.grp = nil
	}
	for _, kv := range t.kv {
		errs = append(errs, kv.Free())
	}
	t.kv = nil
	return errors.Join(errs...)
}

// tpBackends swaps tutti-cpu for its N-rank group (gpus > 1); every other
// backend runs as it is (they have no notion of ranks). It refuses a degree
// the model's KV heads cannot be split over, before anything runs.
func tpBackends(bs []harness.Backend, gpus int, planner *harness.Compute, prof model.Profile) ([]harness.Backend, error) {
	if gpus < 1 || gpus > tp.MaxRanks {
		return nil, fmt.Errorf("--gpus %d: must be in [1, %d]", gpus, tp.MaxRanks)
	}
	if gpus == 1 {
		return bs, nil
	}
	g, err := prof.Geometry()
	if err != nil {
		return nil, err
	}
	if _, err := tp.ShardGeometry(g, gpus); err != nil {
		return nil, fmt.Errorf("--gpus %d with model %s: %w", gpus, prof.Name, err)
	}
	swapped := false
	out := make([]harness.Backend, len(bs))
	for i, b := range bs {
		if b.Name() == "tutti-cpu" {
			b, swapped = newTPBackend(gpus, planner), true
		}
		out[i] = b
	}
	if !swapped {
		return nil, fmt.Errorf("--gpus %d runs the tutti-cpu backend over %d ranks; it is not among the backends", gpus, gpus)
	}
	return out, nil
}
