package gpubench

// gpubench --gpus N: the model's KV restored by N tensor-parallel
// ranks at once (runtime/tp on the GPU path: per rank its own store, SQPOLL
// ring, staging and restorer, on GPU r mod visible), next to one rank of the
// same shape in the same call.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	evalmodel "github.com/tutti-io/tutti/eval/model"
	"github.com/tutti-io/tutti/internal/kvdata"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
	"github.com/tutti-io/tutti/runtime/tp"
)

type groupBenchOptions struct {
	model  string
	g      kvshape.Geometry
	layout kvshape.Layout
	tokens int
	dirs   []string // split over the ranks by rankDirs
	ranks  int
	path   runtime.Path
	seed   uint64
	reps   int
	// staging per rank
	stagingBytes, slotBytes int64
	// the GPU path's reads, per rank (runtime.GPUConfig IOWindow,
	// MaxIOBytes, Lookahead; 0: sized to the rank's devices)
	window, maxIO, lookahead int
}

// groupBenchRow is one run: --json writes one per line.
type groupBenchRow struct {
	Path        string    `json:"path"`
	Model       string    `json:"model"`
	Ranks       int       `json:"ranks"`
	Devices     []int     `json:"devices"`
	Bytes       int64     `json:"bytes"` // whole-model bytes per restore, all ranks
	Seconds     float64   `json:"seconds"`
	BytesPerS   float64   `json:"bytes_per_s"` // aggregate
	RankSeconds []float64 `json:"rank_seconds"`
	XSingle     float64   `json:"x_single"` // aggregate / the one-rank run's
	IOs         int64     `json:"ios"`
	Mismatches  uint64    `json:"verify_mismatches"` // pages (of any rank) that differ from what it saved
	Window      int       `json:"window"`            // per rank: GPU reads in flight
	MaxIOBytes  int       `json:"max_io_bytes"`      // per rank: largest read
	Lookahead   int       `json:"lookahead"`         // per rank: layers in flight beyond the one waited for
	Error       string    `json:"error,omitempty"`
}

// runGroupBench runs one rank, then o.ranks ranks, on the same shape.
func runGroupBench(ctx context.Context, o groupBenchOptions, stderr io.Writer) []groupBenchRow {
	var rows []groupBenchRow
	for _, n := range []int{1, o.ranks} {
		row, err := groupBenchOnce(ctx, o, n, stderr)
		if err != nil {
			row.Error = err.Error()
		}
		if len(rows) > 0 && rows[0].BytesPerS > 0 {
			row.XSingle = row.BytesPerS / rows[0].BytesPerS
		} else if n == 1 {
			row.XSingle = 1
		}
		rows = append(rows, row)
	}
	return rows
}

// rankSalt makes each rank's content its own (split heads) or the same
// (a replicated latent).
func rankSalt(g kvshape.Geometry, r int) uint64 {
	if tp.Replicated(g) {
		return 0
	}
	return uint64(r+1) << 56
}

// groupBenchOnce saves the prefix through n ranks, then times o.reps
// restores of it (every page poisoned before each) and verifies the last.
func groupBenchOnce(ctx context.Context, o groupBenchOptions, n int, stderr io.Writer) (groupBenchRow, error) {
	row := groupBenchRow{Path: "tutti-tp-" + o.path.String(), Model: o.model, Ranks: n}
	shard, err := tp.ShardGeometry(o.g, n)
	if err != nil {
		return row, err
	}
	blockTokens := o.g.PageTokens * o.g.ChunkPages
	blocks := max(1, (o.tokens+blockTokens-1)/blockTokens)
	numPages := blocks*o.g.ChunkPages + blocks/8 + 16
	cfg, removeDirs, err := groupConfig(o, n, blocks, numPages, shard, &row)
	defer removeDirs()
	if err != nil {
		return row, err
	}
	grp, err := tp.Open(cfg)
	if err != nil {
		return row, err
	}
	defer grp.Close()
	kv := &groupKV{o: o, shard: shard, numPages: numPages}
	defer kv.free()
	for r := 0; r < n; r++ {
		row.Devices = append(row.Devices, grp.Device(r))
	}
	if err := kv.register(grp, n); err != nil {
		return row, err
	}
	chain := make([]uint64, blocks)
	for i := range chain {
		chain[i] = o.seed + uint64(i)
	}
	rng := rand.New(rand.NewPCG(o.seed, 11))
	perm := rng.Perm(numPages)
	kv.pages = make([]int32, blocks*o.g.ChunkPages)
	for i := range kv.pages {
		kv.pages[i] = int32(perm[i])
	}
	kv.chain = chain
	kv.each(func(_ int, k kvdata.Key, b []byte) { kvdata.Fill(b, k) })
	if err := kv.copy(true); err != nil {
		return row, err
	}
	sv, err := grp.Save(chain, kv.pages)
	if err != nil {
		return row, err
	}
	sv.Wait()
	if sv.Saved() != blocks {
		return row, fmt.Errorf("saved %d of %d blocks (%v)", sv.Saved(), blocks, sv.Failed())
	}
	if err := timeLoads(ctx, grp, kv, o.reps, &row); err != nil {
		return row, err
	}
	if err := kv.copy(false); err != nil {
		return row, err
	}
	var bad atomic.Uint64
	kv.each(func(_ int, k kvdata.Key, b []byte) {
		if kvdata.Verify(b, k) >= 0 {
			bad.Add(1)
		}
	})
	row.Mismatches = bad.Load()
	fmt.Fprintf(stderr, "  %d rank(s) on devices %v: %.2f GB/s aggregate, ranks done after %v s, %d mismatched pages\n",
		n, row.Devices, row.BytesPerS/1e9, row.RankSeconds, row.Mismatches)
	return row, nil
}

// groupConfig is the tp.Config of n ranks for blocks chain blocks, its GPU
// reads sized to rank 0's devices (the sizes put in row), each rank's
// stores in fresh directories under its share of o.dirs (rankDirs);
// removeDirs removes those, also after an error.
func groupConfig(o groupBenchOptions, n, blocks, numPages int, shard kvshape.Geometry, row *groupBenchRow) (cfg tp.Config, removeDirs func(), err error) {
	var made []string
	removeDirs = func() {
		for _, d := range made {
			os.RemoveAll(d)
		}
	}
	payload := int64(blocks) * shard.ChunkBytes()
	row.Bytes = payload * int64(n)
	split := rankDirs(o.dirs, n)
	sized := runtime.DeviceSizedGPUReads(split[0]).Explicit(o.window, o.maxIO, 0)
	window, maxIO, lookahead := sized.Window, sized.MaxIOBytes, o.lookahead
	if lookahead == 0 {
		// as gpubench: enough layers of this rank's shard to fill the window
		lookahead = runtime.GPULookaheadToFill(window, maxIO, len(split[0]), payload/int64(o.g.Layers))
	}
	row.Window, row.MaxIOBytes, row.Lookahead = window, maxIO, lookahead
	cfg = tp.Config{Ranks: n, Store: runtime.Config{
		CapacityBytes: payload + payload/8 + 64<<20, Geometry: o.g, Layout: o.layout, NumPages: numPages,
		Path: o.path, StagingBytes: o.stagingBytes, StagingSlotBytes: o.slotBytes, QueueDepth: 64,
		SaveBoundMs: 600000, SaveBudgetBytes: 2 * payload,
		GPU: runtime.GPUConfig{MaxPages: blocks * o.g.ChunkPages, IOWindow: window, MaxIOBytes: maxIO, Lookahead: lookahead},
	}}
	for r, parents := range split {
		var ds []string
		for _, parent := range parents {
			d, err := os.MkdirTemp(parent, fmt.Sprintf("tutti-tp-rank%d-", r))
			if err != nil {
				return cfg, removeDirs, err
			}
			made = append(made, d)
			ds = append(ds, d)
		}
		cfg.Dirs = append(cfg.Dirs, ds)
	}
	return cfg, removeDirs, nil
}

// timeLoads times reps restores of kv's chain, every page poisoned before
// each so that a page a restore skipped cannot pass; it fills the row's
// seconds, bytes/s, per-rank seconds and read I/Os. A cancelled ctx stops
// it between restores.
func timeLoads(ctx context.Context, grp *tp.Group, kv *groupKV, reps int, row *groupBenchRow) error {
	n := len(row.Devices)
	reps = max(1, reps)
	before := grp.Stats()
	var elapsed time.Duration
	row.RankSeconds = make([]float64, n)
	for rep := 0; rep < reps; rep++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		kv.each(func(_ int, _ kvdata.Key, b []byte) {
			for i := range b {
				b[i] = 0xA5
			}
		})
		if err := kv.copy(true); err != nil {
			return err
		}
		start := time.Now()
		l, err := grp.Load(kv.chain, kv.pages)
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		for r := 0; r < n; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if rl := l.Rank(r); rl != nil {
					_ = rl.Wait()
				}
				row.RankSeconds[r] += time.Since(start).Seconds() / float64(reps)
			}()
		}
		wg.Wait()
		if err := l.Wait(); err != nil {
			return err
		}
		elapsed += time.Since(start)
		if l.Blocks() != len(kv.chain) {
			return fmt.Errorf("restored %d of %d blocks", l.Blocks(), len(kv.chain))
		}
	}
	after := grp.Stats()
	for r := range after.Rank {
		row.IOs += after.Rank[r].Loads.ReadIOs - before.Rank[r].Loads.ReadIOs
	}
	row.Seconds = elapsed.Seconds() / float64(reps)
	row.BytesPerS = float64(row.Bytes) / row.Seconds
	return nil
}

// groupKV is the ranks' KV: a host mirror per rank (what the test fills
// and verifies) and, on the GPU path, device tensors the mirrors are
// copied to and from. free releases both.
type groupKV struct {
	o        groupBenchOptions
	shard    kvshape.Geometry
	numPages int
	mirrors  []*runtime.HostKV
	dev      [][]uint64 // per rank, device tensors (PathGPU)
	chain    []uint64
	pages    []int32
}

func (k *groupKV) free() {
	for _, ps := range k.dev {
		for _, p := range ps {
			kernels.DevFree(p)
		}
	}
	for _, m := range k.mirrors {
		if m != nil {
			m.Free()
		}
	}
}

func regionsOf(m runtime.KVMemory) []runtime.Region {
	if len(m.Layers) > 0 {
		return m.Layers
	}
	return []runtime.Region{m.Cross}
}

// register allocates each of n ranks' KV and registers it with grp.
func (k *groupKV) register(grp *tp.Group, n int) error {
	k.mirrors = make([]*runtime.HostKV, n)
	for r := 0; r < n; r++ {
		var err error
		if k.mirrors[r], err = runtime.AllocHostKV(k.shard, k.o.layout, k.numPages); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		mem := k.mirrors[r].Memory()
		if k.o.path == runtime.PathGPU {
			var ps []uint64
			var out runtime.KVMemory
			for _, reg := range regionsOf(mem) {
				p, err := kernels.DevAllocOn(grp.Device(r), reg.LenBytes)
				if err != nil {
					return fmt.Errorf("rank %d: %w", r, err)
				}
				ps = append(ps, p)
				if k.o.layout == kvshape.LayoutPerLayer {
					out.Layers = append(out.Layers, runtime.Region{Addr: uintptr(p), LenBytes: reg.LenBytes})
				} else {
					out.Cross = runtime.Region{Addr: uintptr(p), LenBytes: reg.LenBytes}
				}
			}
			k.dev = append(k.dev, ps)
			mem = out
		}
		if err := grp.RegisterKV(r, mem); err != nil {
			return err
		}
	}
	return nil
}

// copy copies the mirrors to the device tensors (toDevice) or back; a
// no-op on the CPU path.
func (k *groupKV) copy(toDevice bool) error {
	for r, ps := range k.dev {
		for i, reg := range regionsOf(k.mirrors[r].Memory()) {
			var err error
			if toDevice {
				err = kernels.CopyToDevice(ps[i], reg.Addr, reg.LenBytes)
			} else {
				err = kernels.CopyToHost(reg.Addr, ps[i], reg.LenBytes)
			}
			if err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
	}
	return nil
}

// each visits every (rank, block, page, layer, plane) page of the
// request, one goroutine per rank.
func (k *groupKV) each(fn func(r int, key kvdata.Key, b []byte)) {
	g := k.o.g
	var wg sync.WaitGroup
	for r := range k.mirrors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, id := range k.chain {
				for j := 0; j < g.ChunkPages; j++ {
					for l := 0; l < g.Layers; l++ {
						for pl := 0; pl < g.Planes; pl++ {
							key := kvdata.Key{Block: id ^ rankSalt(g, r), Layer: l, Plane: pl, Page: j}
							fn(r, key, k.mirrors[r].Page(l, pl, k.pages[i*g.ChunkPages+j]))
						}
					}
				}
			}
		}()
	}
	wg.Wait()
}

// rankDirs splits the --dir list over n ranks, so that the one-rank run and
// the n-rank run of the same command use the same storage: with at least n
// directories, rank r stripes over every dirs[i] with i mod n == r (one rank
// stripes over all of them); with fewer, rank r takes dirs[r mod len(dirs)]
// alone, and ranks share a directory's device.
func rankDirs(dirs []string, n int) [][]string {
	out := make([][]string, n)
	if len(dirs) < n {
		for r := range out {
			out[r] = []string{dirs[r%len(dirs)]}
		}
		return out
	}
	for i, d := range dirs {
		out[i%n] = append(out[i%n], d)
	}
	return out
}

// runGroupBenchCLI is `tutti gpubench --gpus N`: the GPU path through
// runtime/tp, stores under --dir (comma-separated: one per device spreads
// the ranks). It prints a table, writes --json rows, and fails on any
// mismatch or error.
func runGroupBenchCLI(ctx context.Context, f Config, stdout, stderr io.Writer) error {
	model, tokens, dir, gpus := f.Model, f.Tokens, f.Dir, f.GPUs
	prof, err := evalmodel.Lookup(model)
	if err != nil {
		return err
	}
	g, err := prof.Geometry()
	if err != nil {
		return err
	}
	if dir == "" {
		return errors.New("--gpus needs --dir (the ranks' stores go there; comma-separated directories spread them)")
	}
	o := groupBenchOptions{model: model, g: g, tokens: tokens, dirs: strings.Split(dir, ","), ranks: gpus,
		path: runtime.PathGPU, seed: f.Seed, reps: 3, stagingBytes: 256 << 20, slotBytes: 32 << 20,
		window: f.Window, maxIO: f.MaxIO, lookahead: f.Lookahead}
	if f.Layout == "cross-layer" {
		o.layout = kvshape.LayoutCrossLayer
	}
	if _, err := tp.ShardGeometry(g, gpus); err != nil {
		return fmt.Errorf("--gpus %d with %s: %w", gpus, model, err)
	}
	fmt.Fprintf(stdout, "gpubench --gpus %d: %s (%s), %d tokens in %d-token chain blocks, %s, each rank its own store, ring, staging and restorer; %s\n",
		gpus, model, g, tokens, g.PageTokens*g.ChunkPages, map[bool]string{true: "MLA latent replicated on every rank", false: "KV heads split over the ranks"}[tp.Replicated(g)], time.Now().UTC().Format(time.RFC3339))
	rows := runGroupBench(ctx, o, stderr)
	fmt.Fprintf(stdout, "%-16s %5s %10s %9s %10s %9s %9s %14s %s\n", "path", "ranks", "devices", "GB/s", "x single", "I/Os", "mismatch", "win/KiB/ahead", "error")
	var failed []string
	for _, r := range rows {
		fmt.Fprintf(stdout, "%-16s %5d %10v %9.2f %10.3f %9d %9d %14s %s\n", r.Path, r.Ranks, r.Devices, r.BytesPerS/1e9, r.XSingle, r.IOs, r.Mismatches,
			fmt.Sprintf("%d/%d/%d", r.Window, r.MaxIOBytes>>10, r.Lookahead), r.Error)
		if r.Error != "" || r.Mismatches > 0 {
			failed = append(failed, fmt.Sprintf("%d ranks: %d mismatched pages %s", r.Ranks, r.Mismatches, r.Error))
		}
	}
	if err := writeJSONLines(f.JSONPath, stdout, rows); err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("gpubench --gpus %d: %s", gpus, strings.Join(failed, "; "))
	}
	return nil
}
