package tp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tutti-io/tutti/internal/benchenv"
	"github.com/tutti-io/tutti/kernels"
	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime"
)

// BenchmarkGroupRestore restores one prefix of the Llama-3-70B KV shape (80
// layers, 8 KV heads, head dim 128, bf16, 16-token pages, one page per chain
// block) with the KV heads split over N tensor-parallel ranks, all ranks at
// once, and reports the aggregate bandwidth (whole-model bytes per second)
// next to the single-rank run of the same shape in the same process
// (x-single). Every rank's restored shard is checked bit for bit after the
// timed loop.
//
// Knobs: TUTTI_BENCH_RANKS (default "1,2,4"; run 1 first for x-single),
// TUTTI_BENCH_PATH=gpu (GPU-driven restores into HBM; rank r on device r mod
// visible GPUs, its KV allocated there; skipped where that cannot run),
// TUTTI_BENCH_DIRS (comma-separated store directories; rank r uses the r-th mod their count, so one directory per device spreads
// the ranks; default a temporary one), TUTTI_BENCH_LAYERS (default 80: 10 GiB
// of KV), TUTTI_BENCH_TOKENS (default 32768), TUTTI_BENCH_STAGING_MIB
// (default 256 per rank), TUTTI_BENCH_SLOT_MIB (default 32).
func BenchmarkGroupRestore(b *testing.B) {
	rankList := os.Getenv("TUTTI_BENCH_RANKS")
	if rankList == "" {
		rankList = "1,2,4"
	}
	var single float64
	for _, f := range strings.Split(rankList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("TUTTI_BENCH_RANKS: %q", f)
		}
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			bw := benchGroup(b, n)
			if n == 1 {
				single = bw
			}
			if single > 0 {
				b.ReportMetric(bw/single, "x-single")
			}
		})
	}
}

func benchGroup(b *testing.B, n int) float64 {
	g := benchenv.Llama70B(benchenv.Layers(), 1)
	tokens := benchenv.Int("TUTTI_BENCH_TOKENS", 32<<10)
	blocks := tokens / g.PageTokens
	payload := int64(blocks) * g.ChunkBytes() // whole model, all ranks
	z := benchenv.Size(payload / int64(n))
	cfg := Config{Ranks: n, Store: runtime.Config{Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: blocks,
		CapacityBytes: z.CapacityBytes, StagingBytes: z.StagingBytes, StagingSlotBytes: z.StagingSlotBytes,
		QueueDepth: z.QueueDepth, SaveBoundMs: z.SaveBoundMs, SaveBudgetBytes: z.SaveBudgetBytes}}
	// Rank r's store in the r-th root mod their count.
	roots := benchenv.Roots(b)
	for r := 0; r < n; r++ {
		d := benchenv.Under(b, roots[r%len(roots)], fmt.Sprintf("tutti-tp-rank%d-", r))
		cfg.Dirs = append(cfg.Dirs, []string{filepath.Clean(d)})
	}
	gpu := benchenv.GPU()
	if gpu {
		cfg.Store.Path = runtime.PathGPU
		cfg.Store.GPU.MaxPages = blocks
	}
	grp, err := Open(cfg)
	if errors.Is(err, runtime.ErrGPUUnavailable) && !kernels.Explicit() {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer grp.Close()
	tg := &group{Group: grp, full: g, numPages: blocks}
	var devs []*rankDeviceKV
	for r := 0; r < n; r++ {
		if gpu {
			d := newRankDeviceKV(b, grp.Device(r), grp.ShardGeometry(), cfg.Store.Layout, blocks)
			devs = append(devs, d)
			tg.kv = append(tg.kv, d.mirror)
			err = grp.RegisterKV(r, d.mem)
		} else {
			kv, aerr := runtime.AllocHostKV(grp.ShardGeometry(), cfg.Store.Layout, blocks)
			if aerr != nil {
				b.Fatal(aerr)
			}
			defer kv.Free()
			tg.kv = append(tg.kv, kv)
			err = grp.RegisterKV(r, kv.Memory())
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	copyAll := func(toDevice bool) {
		for _, d := range devs {
			d.copy(b, toDevice)
		}
	}
	chain := chainOf(1<<40, blocks)
	pages := make([]int32, blocks)
	for i := range pages {
		pages[i] = int32(i)
	}
	tg.fill(chain, pages)
	copyAll(true)
	sv, err := grp.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	sv.Wait()
	if sv.Saved() != blocks {
		b.Fatalf("saved %d of %d blocks (failed: %v)", sv.Saved(), blocks, sv.Failed())
	}
	tg.scramble()
	copyAll(true)
	bw := benchenv.TimeLoads(b, blocks, payload, func() (*Load, error) { return grp.Load(chain, pages) }, nil)
	copyAll(false)
	if err := tg.verify(chain, pages, blocks); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(bw/1e9, "GB/s")
	b.ReportMetric(bw/1e9/float64(n), "GB/s/rank")
	return bw
}
