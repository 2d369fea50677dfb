package runtime

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tutti-io/tutti/kvshape"
	"github.com/tutti-io/tutti/runtime/internal/mover/gpu/gputest"
)

// BenchmarkGPULoadGoSide is what a PathGPU Load costs on the Go side alone:
// a llama3-8b-shaped restore (32 layers, 64 blocks of 32 pages, over 4
// directories sized as gpubench's store rows size them; KV heads cut to one
// so the host KV fits here) from Load to Wait through a restorer whose
// layers complete at once with nothing read: pin, resolve, the GPU cut,
// planning and dispatching the restore, building its extents, retiring its
// layers, the device models, finish. On the GPU machine a Load costs this
// plus the restore itself.
func BenchmarkGPULoadGoSide(b *testing.B) {
	g := kvshape.Geometry{Layers: 32, KVHeads: 1, HeadDim: 64, DType: kvshape.BF16, Planes: 2, PageTokens: 16, ChunkPages: 32}
	const blocks = 64
	pages := blocks * g.ChunkPages
	numPages := pages + pages/8 + 16
	dirs := []string{b.TempDir(), b.TempDir(), b.TempDir(), b.TempDir()}
	bound := make(chan *gputest.Restorer, 1)
	cfg := Config{Dirs: dirs, Geometry: g, Layout: kvshape.LayoutPerLayer, NumPages: numPages,
		CapacityBytes: CapacityForBlocks(g, blocks) + int64(len(dirs))*(64<<20), SaveBoundMs: 600000,
		SaveBudgetBytes: int64(blocks) * g.ChunkBytes(), Path: PathGPU, gpuBind: cpuGPU(nil, bound)}
	cfg.GPU.MaxPages = pages
	s, kv := openKV(b, cfg)
	defer closeKV(b, s, kv)
	gpu := <-bound
	rng := rand.New(rand.NewPCG(3, 3))
	chain := chainOf(5000, blocks)
	pt := pageTable(rng, g, numPages, blocks)
	fill(kv, g, chain, pt)
	sv, err := s.Save(chain, pt)
	if err != nil {
		b.Fatal(err)
	}
	sv.Wait()
	if sv.Saved() != blocks {
		b.Fatalf("saved %d of %d", sv.Saved(), blocks)
	}
	gpu.NoIO = true
	var submitNs int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		l, err := s.Load(chain, pt)
		if err != nil {
			b.Fatal(err)
		}
		submitNs += int64(time.Since(t0))
		if err := l.Wait(); err != nil || l.Blocks() != blocks {
			b.Fatalf("loaded %d of %d: %v", l.Blocks(), blocks, err)
		}
	}
	// Load returns once the restore is on the GPU (submitted).
	b.ReportMetric(float64(submitNs)/float64(b.N)/1e3, "us-to-submit/op")
}
