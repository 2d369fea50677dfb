package runtime

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tutti-io/tutti/devbench"
	"github.com/tutti-io/tutti/internal/benchenv"
	"github.com/tutti-io/tutti/kvshape"
)

// BenchmarkRestore70B restores a 32K-token prefix in the Llama-3-70B KV shape
// (80 layers, 8 KV heads, head dim 128, bf16, 16-token pages, vLLM block
// hashing: one page per chain block) into host KV memory on the CPU path,
// and reports its bandwidth as a fraction of the devbench ceiling (1 MiB
// O_DIRECT random reads, queue depth 32) measured in the same run on the
// same directory.
//
// Knobs: TUTTI_BENCH_PATH=gpu (restore with GPU-driven reads into HBM through
// package kernels; skipped where that cannot run),
// TUTTI_BENCH_DIRS (store directories: the first is used; unset, the
// benchmark is skipped),
// TUTTI_BENCH_LAYERS (default 80: 10 GiB of KV, as much host memory),
// TUTTI_BENCH_STAGING_MIB (default 256), TUTTI_BENCH_SLOT_MIB (default 32).
func BenchmarkRestore70B(b *testing.B) {
	dir := benchenv.Dirs(b)[0]
	g := benchenv.Llama70B(benchenv.Layers(), 1)
	const tokens = 32 << 10
	blocks := tokens / g.PageTokens
	payload := int64(blocks) * g.ChunkBytes()
	z := benchenv.Size(payload)
	cfg := Config{Dirs: []string{dir}, Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: blocks,
		CapacityBytes: z.CapacityBytes, StagingBytes: z.StagingBytes, StagingSlotBytes: z.StagingSlotBytes,
		QueueDepth: z.QueueDepth, SaveBoundMs: z.SaveBoundMs, SaveBudgetBytes: z.SaveBudgetBytes}
	s, kv, dkv := openBenchStore(b, cfg)
	chain := chainOf(1<<40, blocks)
	pages := make([]int32, blocks)
	for i := range pages {
		pages[i] = int32(i)
	}
	fill(kv, g, chain, pages)
	if dkv != nil {
		dkv.upload(b)
	}
	sv, err := s.Save(chain, pages)
	if err != nil {
		b.Fatal(err)
	}
	sv.Wait()
	if sv.Saved() != blocks {
		b.Fatalf("saved %d of %d blocks: %v", sv.Saved(), blocks, s.Stats())
	}
	ceiling, _, err := devbench.Ceiling(context.Background(), dir, 4<<30)
	if err != nil {
		b.Fatal(err)
	}
	scramble(kv, g, cfg.NumPages)
	if dkv != nil {
		dkv.upload(b)
	}
	bw := benchenv.TimeLoads(b, blocks, payload, func() (*Load, error) { return s.Load(chain, pages) }, func(l *Load) string {
		return fmt.Sprintf(" (planned %d; first failure: %v): %v", l.Planned(), l.Failure(), s.Stats())
	})
	if dkv != nil {
		dkv.download(b)
	}
	if err := verify(kv, g, chain, pages, blocks); err != nil {
		b.Fatal(err)
	}
	st := s.Stats()
	b.ReportMetric(bw/1e9, "GB/s")
	b.ReportMetric(ceiling/1e9, "ceiling-GB/s")
	b.ReportMetric(bw/ceiling, "of-ceiling")
	b.ReportMetric(float64(st.Loads.ReadIOs)/float64(st.Loads.Calls)/float64(g.Layers), "reads/layer")
}

// openBenchStore opens cfg for a benchmark, on PathGPU with KV in HBM where
// TUTTI_BENCH_PATH=gpu asks (skipping b where that cannot run), else with
// host KV, and registers the KV. kv is what the benchmark fills and
// verifies: on PathGPU dkv's host mirror (dkv.upload and dkv.download move
// it), dkv nil otherwise. The store closes at b's cleanup, before the KV
// memory it was given is freed.
func openBenchStore(b *testing.B, cfg Config) (s *Store, kv *HostKV, dkv *deviceKV) {
	b.Helper()
	gpu := benchenv.GPU()
	if gpu {
		cfg.Path, cfg.GPU.MaxPages = PathGPU, cfg.NumPages
	}
	s, err := Open(cfg)
	if errors.Is(err, ErrGPUUnavailable) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	registered := false
	defer func() {
		if !registered { // a Fatal below
			_ = s.Close()
		}
	}()
	if gpu {
		dkv = newDeviceKV(b, cfg.Geometry, cfg.Layout, cfg.NumPages)
		kv, err = dkv.mirror, s.RegisterKV(dkv.mem)
	} else if kv, err = AllocHostKV(cfg.Geometry, cfg.Layout, cfg.NumPages); err == nil {
		b.Cleanup(func() { _ = kv.Free() })
		err = s.RegisterKV(kv.Memory())
	}
	if err != nil {
		b.Fatal(err)
	}
	registered = true
	b.Cleanup(func() { _ = s.Close() }) // registered last, so run first
	return s, kv, dkv
}
