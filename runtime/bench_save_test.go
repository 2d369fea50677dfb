package runtime

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tutti-io/tutti/devbench"
	"github.com/tutti-io/tutti/internal/benchenv"
	"github.com/tutti-io/tutti/kvshape"
)

// BenchmarkSaveStriped saves a 32K-token prefix in the Llama-3-8B KV shape
// (32 layers, 8 KV heads, head dim 128, bf16, 16-token pages, 512-token
// chain blocks: 4 GiB) from host KV memory on the CPU path, striped over
// every directory, timed from Save to Done (the durable commit), each
// iteration into a fresh store. It reports the bandwidth as a fraction of
// the directories' write ceiling measured in the same run (devbench's
// O_DIRECT 1 MiB sequential writes at queue depth 32, every directory at
// once, their rates summed), as gpubench's store-cpu save row does.
//
// Knobs: TUTTI_BENCH_DIRS (comma-separated store directories, one file
// system each; unset, the benchmark is skipped), TUTTI_BENCH_LAYERS
// (default 32: 4 GiB of KV, as much host memory).
func BenchmarkSaveStriped(b *testing.B) {
	roots := benchenv.Roots(b)
	g := benchenv.Llama70B(benchenv.Int("TUTTI_BENCH_LAYERS", 32), 32)
	const tokens = 32 << 10
	blocks := tokens / (g.PageTokens * g.ChunkPages)
	payload := int64(blocks) * g.ChunkBytes()
	numPages := blocks*g.ChunkPages + 16
	kv, err := AllocHostKV(g, kvshape.LayoutPerLayer, numPages)
	if err != nil {
		b.Fatal(err)
	}
	defer kv.Free()
	chain := chainOf(1<<40, blocks)
	perm := rand.New(rand.NewPCG(1, 7)).Perm(numPages)
	pages := make([]int32, blocks*g.ChunkPages)
	for i := range pages {
		pages[i] = int32(perm[i])
	}
	fill(kv, g, chain, pages)
	ceiling := writeCeiling(b, roots, payload/int64(len(roots)))
	var elapsed time.Duration
	b.SetBytes(payload)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		var dirs []string
		for _, r := range roots {
			dirs = append(dirs, benchenv.Under(b, r, "tutti-bench-save-"))
		}
		cfg := Config{Dirs: dirs, Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: numPages,
			CapacityBytes: CapacityForBlocks(g, blocks) + int64(len(dirs))*(64<<20),
			SaveBoundMs:   600000, SaveBudgetBytes: payload}
		s, err := Open(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.RegisterKV(kv.Memory()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		sv, err := s.Save(chain, pages)
		if err != nil {
			b.Fatal(err)
		}
		sv.Wait()
		elapsed += time.Since(start)
		b.StopTimer()
		if sv.Saved() != blocks {
			b.Fatalf("saved %d of %d blocks: %+v", sv.Saved(), blocks, s.Stats())
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	bw := float64(payload) * float64(b.N) / elapsed.Seconds()
	b.ReportMetric(bw/1e9, "GB/s")
	b.ReportMetric(ceiling/1e9, "ceiling-GB/s")
	b.ReportMetric(bw/ceiling, "of-ceiling")
}

// writeCeiling is the directories' write ceiling: devbench's O_DIRECT
// sequential 1 MiB writes at queue depth 32 into one file of fileBytes
// (64 MiB..1 GiB) per directory, every directory at once, rates summed.
func writeCeiling(b *testing.B, roots []string, fileBytes int64) float64 {
	b.Helper()
	fileBytes = min(max(fileBytes, 64<<20), 1<<30) &^ (1<<20 - 1)
	rates := make([]float64, len(roots))
	errs := make([]error, len(roots))
	var wg sync.WaitGroup
	for i, r := range roots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := filepath.Join(r, "tutti-bench-save-ceiling.dat")
			defer os.Remove(f)
			rows, err := devbench.Run(context.Background(), devbench.Config{Path: f, BlockSizes: []int{1 << 20}, QueueDepths: []int{32},
				Engines: []string{"uring"}, Ops: []string{"seqwrite"}, Runtime: 2 * time.Second, SizeBytes: fileBytes, Keep: true, Seed: uint64(i + 1)})
			if err == nil && len(rows) != 1 {
				err = fmt.Errorf("%d rows", len(rows))
			}
			if err != nil {
				errs[i] = fmt.Errorf("write ceiling of %s: %w", r, err)
				return
			}
			rates[i] = rows[0].BytesPerS
		}()
	}
	wg.Wait()
	sum := 0.0
	for i, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
		sum += rates[i]
	}
	return sum
}
